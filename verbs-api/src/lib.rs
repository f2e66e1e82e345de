//! The Rust verbs API of roxe.
//!
//! Programs call this crate; it picks a backend (the soft transport in
//! [`roxe_provider`], or later a real NIC through libibverbs). See
//! `docs/ARCHITECTURE.md`.

pub use roxe_provider as provider;
pub use roxe_wire as wire;
