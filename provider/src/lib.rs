//! roxe's soft RoCEv2 backend.
//!
//! This crate will hold the sans-IO transport engine (requester, responder,
//! completer as state machines driven by posted work requests, received
//! packets and a caller-supplied clock) and the I/O driver that puts it on UDP
//! port 4791. See `docs/ARCHITECTURE.md`. It builds on [`roxe_wire`] only.

pub use roxe_wire as wire;
