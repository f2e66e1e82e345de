//! Putting a [`View`] in place for this process and what it runs: a mount
//! namespace of its own (inside a user namespace of its own when not
//! root) where tmpfs directories stand over `/sys/class` and `/dev`,
//! every real entry bound back into them, the view's entries added.
//! Nothing outside the namespace changes, and it ends with the last
//! process in it.

use super::view::{Node, View};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// How the namespace was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// As root: a mount namespace.
    MountNamespace,
    /// Unprivileged: a user namespace (this user's id mapped to itself)
    /// and a mount namespace in it.
    UserNamespace,
}

/// Enter new namespaces and put `view` in place. On error nothing is
/// mounted outside them; the error says which step failed.
pub fn enter(view: &View, real_verbs_dirs: &[&str]) -> Result<Made, String> {
    let made = unshare()?;
    // Mounts made here must not propagate back to the host's namespace.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| format!("making / private in the new mount namespace: {e}"))?;
    overlay(Path::new("/sys/class"), &view.sys_class, real_verbs_dirs)?;
    overlay(Path::new("/dev"), &view.dev, &["infiniband"])?;
    Ok(made)
}

fn unshare() -> Result<Made, String> {
    use rustix::thread::UnshareFlags;
    let root = rustix::process::geteuid().is_root();
    // SAFETY: no FILES flag: file descriptor tables are not unshared, so no
    // thread can see a descriptor from another table (`roxe run` has one
    // thread here anyway, which CLONE_NEWUSER requires).
    if root {
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
            .map_err(|e| format!("unshare(CLONE_NEWNS) as root: {e}"))?;
        return Ok(Made::MountNamespace);
    }
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    // SAFETY: as above.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }
        .map_err(|e| format!("unshare(CLONE_NEWUSER | CLONE_NEWNS): {e} (are unprivileged user namespaces allowed? kernel.unprivileged_userns_clone, user.max_user_namespaces, AppArmor's restrict_unprivileged_userns)"))?;
    // The same ids inside as outside, so the program runs as this user
    // (not as root of the namespace: Open MPI refuses that, and files it
    // writes keep their owner).
    let write = |f: &str, s: String| {
        fs::write(f, s).map_err(|e| format!("writing {f} in the new user namespace: {e}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(Made::UserNamespace)
}

/// A tmpfs over `dir`, holding what `dir` held (bound back in; the
/// entries of `merge`, directories, are rebuilt as tmpfs directories so
/// the view can add to them) and `view`'s entries.
fn overlay(dir: &Path, view: &[(String, Node)], merge: &[&str]) -> Result<(), String> {
    let ctx =
        |what: &str, p: &Path, e: &dyn std::fmt::Display| format!("{what} {}: {e}", p.display());
    // The original, reachable through /proc/self/fd after it is covered.
    let orig: OwnedFd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| ctx("opening", dir, &e))?;
    let orig_path = PathBuf::from(format!("/proc/self/fd/{}", orig.as_raw_fd()));
    let entries: Vec<fs::DirEntry> = fs::read_dir(&orig_path)
        .map_err(|e| ctx("listing", dir, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| ctx("listing", dir, &e))?;
    rustix::mount::mount("roxe", dir, "tmpfs", MountFlags::NOSUID, Some(c"mode=0755"))
        .map_err(|e| ctx("mounting a tmpfs over", dir, &e))?;
    for e in &entries {
        let name = e.file_name();
        let src = orig_path.join(&name);
        let dst = dir.join(&name);
        let ft = e.file_type().map_err(|err| ctx("reading", &src, &err))?;
        if ft.is_symlink() {
            let target = fs::read_link(&src).map_err(|err| ctx("reading", &src, &err))?;
            symlink(&target, &dst).map_err(|err| ctx("making", &dst, &err))?;
        } else if ft.is_dir() && merge.iter().any(|m| *m == name) {
            copy_dir(&src, &dst)?;
        } else if ft.is_dir() {
            fs::create_dir(&dst).map_err(|err| ctx("making", &dst, &err))?;
            rustix::mount::mount_bind_recursive(&src, &dst)
                .map_err(|err| ctx("binding", &dst, &err))?;
        } else if ft.is_file() {
            // Plain attribute files (abi_version): a copy reads the same.
            match fs::read(&src) {
                Ok(bytes) => fs::write(&dst, bytes).map_err(|err| ctx("writing", &dst, &err))?,
                Err(_) => bind_file(&src, &dst)?,
            }
        } else {
            bind_file(&src, &dst)?;
        }
    }
    for (rel, node) in view {
        let p = dir.join(rel);
        match node {
            Node::Dir => match fs::create_dir(&p) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(ctx("making", &p, &e))
                }
                _ => {}
            },
            Node::File(text) => fs::write(&p, text).map_err(|e| ctx("writing", &p, &e))?,
            Node::CharDevice => {
                if !p.exists() {
                    bind_file(&orig_path.join("null"), &p)?;
                }
            }
        }
    }
    Ok(())
}

/// Bind `src` (any non-directory) onto a new empty file `dst`.
fn bind_file(src: &Path, dst: &Path) -> Result<(), String> {
    fs::write(dst, b"").map_err(|e| format!("making {}: {e}", dst.display()))?;
    rustix::mount::mount_bind(src, dst).map_err(|e| format!("binding {}: {e}", dst.display()))
}

/// Rebuild directory `src` at `dst` in the tmpfs: symlinks recreated,
/// files copied (or bound when they do not read), directories bound.
fn copy_dir(src: &Path, dst: &Path) -> Result<(), String> {
    fs::create_dir(dst).map_err(|e| format!("making {}: {e}", dst.display()))?;
    for e in fs::read_dir(src).map_err(|e| format!("listing {}: {e}", src.display()))? {
        let e = e.map_err(|e| format!("listing {}: {e}", src.display()))?;
        let (s, d) = (e.path(), dst.join(e.file_name()));
        let ft = e
            .file_type()
            .map_err(|err| format!("reading {}: {err}", s.display()))?;
        if ft.is_symlink() {
            let t = fs::read_link(&s).map_err(|err| format!("reading {}: {err}", s.display()))?;
            symlink(&t, &d).map_err(|err| format!("making {}: {err}", d.display()))?;
        } else if ft.is_dir() {
            fs::create_dir(&d).map_err(|err| format!("making {}: {err}", d.display()))?;
            rustix::mount::mount_bind_recursive(&s, &d)
                .map_err(|err| format!("binding {}: {err}", d.display()))?;
        } else if ft.is_file() {
            match fs::read(&s) {
                Ok(b) => {
                    fs::write(&d, b).map_err(|err| format!("writing {}: {err}", d.display()))?
                }
                Err(_) => bind_file(&s, &d)?,
            }
        } else {
            bind_file(&s, &d)?;
        }
    }
    Ok(())
}
