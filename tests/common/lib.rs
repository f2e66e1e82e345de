//! Cross-crate integration tests (`tests/*.rs`) and criterion benchmarks
//! (`benches/*.rs`) of the roxe workspace live in this package; it has no code
//! of its own.
