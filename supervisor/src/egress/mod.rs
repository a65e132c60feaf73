//! Network egress for `fetch`: the worker never holds a socket; the supervisor's broker makes
//! every request. This module holds the guard the broker applies (the broker itself arrives
//! with the network-egress work).

pub mod guard;
