//! Placement, caching, spike, prefetch and replication policies: pure logic, no I/O, time passed in.
