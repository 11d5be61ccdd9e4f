//! LD_PRELOAD library that routes a private directory's file calls to the kaiso-libfs pool.
