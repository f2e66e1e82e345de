//! Where `roxe run` finds the drop-in libraries: `ROXE_DROPIN_DIR`; beside
//! the `roxe` binary (a cargo build tree: target/<profile>/libibverbs.so);
//! in `../lib/roxe` from it (an installation); or inside `roxe` itself
//! (built with the feature `bundle-dropin`, as `cargo install` needs:
//! written out once to a directory of this user's). The directory handed
//! to the program holds them under their SONAMEs.

use std::path::{Path, PathBuf};

/// The library file in `dir` (`libibverbs.so.1` or cargo's `libibverbs.so`).
fn library_in(dir: &Path) -> Option<PathBuf> {
    ["libibverbs.so.1", "libibverbs.so"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// A directory with `libibverbs.so.1` and `librdmacm.so.1` for
/// `LD_LIBRARY_PATH`, or one line saying where it looked.
pub fn dir() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("ROXE_DROPIN_DIR") {
        candidates.push(PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok())
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        candidates.push(exe_dir.clone());
        candidates.push(exe_dir.join("../lib/roxe"));
    }
    for c in candidates {
        looked.push(c.display().to_string());
        let Some(lib) = library_in(&c) else { continue };
        if c.join("libibverbs.so.1").is_file() && c.join("librdmacm.so.1").exists() {
            return Ok(c);
        }
        return sonames_for(&lib);
    }
    if let Some(dir) = bundled()? {
        return Ok(dir);
    }
    Err(format!(
        "roxe run: the drop-in libibverbs.so.1 is in none of {} (build it with `cargo build -p roxe-ibverbs`, install roxe with `cargo install --path tools --features bundle-dropin`, or set ROXE_DROPIN_DIR)",
        looked.join(", ")
    ))
}

/// The library `roxe` carries (feature `bundle-dropin`), written to a
/// directory of this user's named by its hash (once per build).
#[cfg(feature = "bundle-dropin")]
fn bundled() -> Result<Option<PathBuf>, String> {
    static LIB: &[u8] = include_bytes!(env!("BUNDLED_DROPIN_LIBRARY"));
    let file = write_out(LIB, "libibverbs")?;
    sonames_for(&file).map(Some)
}

/// `bytes` written (once) to `<stat dir>/<stem>-<hash>.so`.
#[cfg(feature = "bundle-dropin")]
fn write_out(bytes: &[u8], stem: &str) -> Result<PathBuf, String> {
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        h.finish()
    };
    let base = roxe_provider::driver::stat::stat_dir()
        .map_err(|e| format!("roxe run: a directory for the bundled library: {e}"))?;
    let file = base.join(format!("{stem}-{tag:016x}.so"));
    if std::fs::metadata(&file).map(|m| m.len()).ok() != Some(bytes.len() as u64) {
        let tmp = base.join(format!(".{stem}-{tag:016x}.{}", std::process::id()));
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| format!("roxe run: writing {}: {e}", file.display()))?;
    }
    Ok(file)
}

#[cfg(not(feature = "bundle-dropin"))]
fn bundled() -> Result<Option<PathBuf>, String> {
    Ok(None)
}

/// The view shim `roxe` carries (feature `bundle-dropin`), written out as
/// the library is.
#[cfg(feature = "bundle-dropin")]
fn bundled_shim() -> Result<Option<PathBuf>, String> {
    static SHIM: &[u8] = include_bytes!(env!("BUNDLED_VIEW_SHIM"));
    write_out(SHIM, "libroxe_view").map(Some)
}

#[cfg(not(feature = "bundle-dropin"))]
fn bundled_shim() -> Result<Option<PathBuf>, String> {
    Ok(None)
}

/// `libroxe_view.so` (the preload view): beside the drop-in's file (a
/// build tree, an installation), or carried inside `roxe`.
pub fn view_shim(libs: &Path) -> Result<PathBuf, String> {
    let beside = std::fs::canonicalize(libs.join("libibverbs.so.1"))
        .ok()
        .and_then(|l| l.parent().map(|d| d.join("libroxe_view.so")))
        .filter(|p| p.is_file());
    if let Some(p) = beside {
        return Ok(p);
    }
    if let Some(p) = bundled_shim()? {
        return Ok(p);
    }
    Err(format!(
        "roxe run: libroxe_view.so is not beside {} (build it with `cargo build -p roxe-view-preload`)",
        libs.display()
    ))
}

/// A directory of this user's holding `libibverbs.so.1` and
/// `librdmacm.so.1` as links to `lib` (one shared object serves both).
fn sonames_for(lib: &Path) -> Result<PathBuf, String> {
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("roxe run: {}: {e}", lib.display()))?;
    let base = roxe_provider::driver::stat::stat_dir()
        .map_err(|e| format!("roxe run: a directory for the library links: {e}"))?;
    // One directory per library path, so concurrent runs of different
    // builds do not swap each other's links.
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        lib.hash(&mut h);
        h.finish()
    };
    let dir = base.join(format!("lib-{tag:016x}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("roxe run: {}: {e}", dir.display()))?;
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&lib, &tmp)
                .and_then(|()| std::fs::rename(&tmp, &link))
                .map_err(|e| format!("roxe run: {}: {e}", link.display()))?;
        }
    }
    Ok(dir)
}
