//! With the feature `bundle-dropin`, `roxe` carries the drop-in
//! `libibverbs.so.1` inside itself, so that `roxe run` works after
//! `cargo install --path tools --features bundle-dropin` (cargo installs
//! binaries only): the library is built here, by a nested `cargo build` of
//! `roxe-ibverbs` into a target directory of its own, and included with
//! `include_bytes!` (see `src/run/dropin.rs`). Without the feature nothing
//! happens here: a build tree has the library beside the binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BUNDLE_DROPIN").is_none() {
        return;
    }
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().expect("tools/ is in the workspace");
    for dir in [
        "wire/src",
        "provider/src",
        "verbs-api/src",
        "verbs-api/capi",
        "tools/preload",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target = out.join("dropin-target");
    let profile = if std::env::var("PROFILE").as_deref() == Ok("release") {
        "release"
    } else {
        "dev"
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "roxe-ibverbs",
            "-p",
            "roxe-view-preload",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        // The outer build's flags are not the library's business.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo build -p roxe-ibverbs");
    assert!(
        status.success(),
        "building the drop-in library failed: {status}"
    );
    let dir = if profile == "dev" { "debug" } else { "release" };
    let lib = target.join(dir).join("libibverbs.so");
    assert!(lib.is_file(), "{} was not built", lib.display());
    println!("cargo:rustc-env=BUNDLED_DROPIN_LIBRARY={}", lib.display());
    let shim = target.join(dir).join("libroxe_view.so");
    assert!(shim.is_file(), "{} was not built", shim.display());
    println!("cargo:rustc-env=BUNDLED_VIEW_SHIM={}", shim.display());
}
