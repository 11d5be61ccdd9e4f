//! FUSE face: a thin adapter from fuser to the kaiso store.
