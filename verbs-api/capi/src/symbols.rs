//! Bind every exported symbol to its rdma-core version node.
//!
//! `build.rs` turns `symbols.txt` (the 146 default-version symbols of
//! rdma-core 44's `libibverbs.so.1`) into one `global_asm!` of
//! `.symver NAME, NAME@@@NODE` directives. `@@@` makes the definition in
//! this object the default version `NAME@@NODE`; a plain
//! `--version-script` cannot do that for a Rust cdylib, because rustc's own
//! anonymous version script comes first and would leave every symbol at
//! `Base` (docs/libibverbs-abi.md §3). The directive only binds a symbol
//! defined in the same object file, hence `codegen-units = 1` for this
//! package in the workspace `Cargo.toml`.
//!
//! Unit-test binaries are executables linked without the version script,
//! where a versioned definition has no node to go to; the directives are
//! compiled only into the library proper.

#[cfg(not(test))]
include!(concat!(env!("OUT_DIR"), "/symver.rs"));
