//! stsd-worker: the sandboxed QuickJS worker process. Built with the sandboxed-execution work;
//! this crate exists now so the workspace has the design card's layout.
