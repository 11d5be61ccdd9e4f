//! Trace readers, workload generators and discrete-event replay through the kaiso policy code.
