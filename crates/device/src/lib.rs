//! Device service-time models (HDD, SSD, NVM, network link) shared by the simulator and the store's tier emulation.
