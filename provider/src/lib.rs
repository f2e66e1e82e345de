//! roxe's soft RoCEv2 backend.
//!
//! The transport engine is *sans-IO* (quinn-proto is the model): its inputs
//! are verbs calls, received packets (parsed by [`roxe_wire`]) and the
//! current time, passed in; its outputs are packets to transmit, completions
//! and the next timer deadline. It never touches a socket or a clock. See
//! `docs/ARCHITECTURE.md`.

pub use roxe_wire as wire;

pub mod memory;
pub mod qp_attr;
mod rng;
pub mod types;

pub use types::{AccessFlags, Errno, PdId, VerbsError, WcOpcode, WcStatus};
pub mod cm;
pub mod cq;
pub mod driver;
pub mod engine;
pub mod logging;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wr;
