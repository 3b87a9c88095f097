//! The appliance daemon: config, executors, client plane, state machines, stats
//! endpoint. Not built yet (see README.md, "Status").
