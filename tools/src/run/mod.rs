//! `roxe run [options] -- PROGRAM ARGS...`: an unmodified program over
//! roxe. The drop-in `libibverbs.so.1` and `librdmacm.so.1` come first in
//! its library path, and roxe's devices are visible where middleware looks
//! for RDMA devices (UCX, libfabric and rdma-core's tests read
//! `/sys/class/infiniband*` and `/dev/infiniband`, not only the verbs):
//! see [`view`] for the files and [`namespace`] for how they are put in
//! place without touching the host. The `ROXE_*` options reach the
//! program's devices through the environment.

mod dropin;
mod namespace;
mod view;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

/// How the devices are made visible.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewMode {
    /// A namespace where the machine allows one, else the preload.
    Auto,
    /// A mount namespace (in a user namespace of its own when not root),
    /// where tmpfs directories over /sys/class and /dev hold the host's
    /// entries and roxe's.
    Namespace,
    /// A preloaded library (libroxe_view.so, LD_PRELOAD) that sends the C
    /// library's path calls for /sys/class/infiniband* and
    /// /dev/infiniband* to files roxe run writes; for machines that allow
    /// no namespace. Statically linked programs and direct system calls
    /// do not see it.
    Preload,
    /// Only the libraries: the program sees roxe's devices through the
    /// verbs, and no /sys or /dev entries.
    None,
}

/// Arguments of `roxe run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How roxe's devices are made visible.
    #[arg(long, value_enum, default_value = "auto")]
    view: ViewMode,
    /// Say nothing on stderr about how the devices were made visible.
    #[arg(short, long)]
    quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<OsString>,
}

/// roxe's devices as the view shows them (none when `ROXE_BACKEND` offers
/// hardware only).
fn view_devices(uverbs_base: u32) -> Result<Vec<view::ViewDevice>, String> {
    let hardware_only = std::env::var("ROXE_BACKEND").is_ok_and(|b| b == "hardware");
    if hardware_only {
        return Ok(Vec::new());
    }
    let infos = roxe_verbs::soft_devices().map_err(|e| format!("roxe run: {e}"))?;
    Ok(infos
        .iter()
        .zip(uverbs_base..)
        .map(|(d, uverbs)| view::ViewDevice {
            name: d.name().to_string(),
            uverbs,
            addr: d.addr(),
            netdev: d
                .addr()
                .and_then(roxe_provider::driver::interface_of)
                .unwrap_or_else(|| "lo".into()),
            guid: d.guid(),
        })
        .collect())
}

/// `roxe run`.
pub fn run(args: &Args) -> ExitCode {
    match prepare(args) {
        Ok(mut cmd) => {
            let e = cmd.exec();
            eprintln!("roxe run: {}: {e}", args.command[0].to_string_lossy());
            ExitCode::from(127)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(125)
        }
    }
}

/// Everything up to the `exec`: the libraries, the view, the command.
fn prepare(args: &Args) -> Result<std::process::Command, String> {
    let libs = dropin::dir()?;
    let base = roxe_verbs::first_free_uverbs();
    let devices = view_devices(base)?;
    let the_view = view::view(&devices);
    let mut preload = None;
    let how = match args.view {
        ViewMode::None => "no /sys or /dev entries (--view none)".to_string(),
        ViewMode::Namespace => in_namespace(&the_view)?,
        ViewMode::Preload => {
            preload = Some(preloaded(&the_view, &libs)?);
            "the preloaded libroxe_view.so (--view preload)".to_string()
        }
        ViewMode::Auto => match in_namespace(&the_view) {
            Ok(how) => how,
            Err(ns) => {
                preload =
                    Some(preloaded(&the_view, &libs).map_err(|p| {
                        format!("{ns}\nroxe run: and the fallback failed too: {p}")
                    })?);
                format!(
                    "the preloaded libroxe_view.so, as no namespace could be made ({})",
                    ns.trim_start_matches("roxe run: ")
                )
            }
        },
    };
    if !args.quiet {
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        eprintln!(
            "roxe run: {} over roxe ({}) through {how}; libraries from {}",
            args.command[0].to_string_lossy(),
            if names.is_empty() {
                "no soft device".to_string()
            } else {
                names.join(", ")
            },
            libs.display()
        );
    }
    let mut path = OsString::from(libs.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_LIBRARY_PATH", path)
        .env("ROXE_UVERBS_BASE", base.to_string());
    if let Some((shim, root)) = preload {
        let mut pre = OsString::from(shim.as_os_str());
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
            pre.push(":");
            pre.push(old);
        }
        cmd.env("LD_PRELOAD", pre).env("ROXE_VIEW_ROOT", root);
    }
    Ok(cmd)
}

/// The view in a namespace of its own; how it was made.
fn in_namespace(the_view: &view::View) -> Result<String, String> {
    let real: Vec<&str> = ["infiniband", "infiniband_verbs"]
        .into_iter()
        .filter(|d| std::path::Path::new("/sys/class").join(d).is_dir())
        .collect();
    let made = namespace::enter(the_view, &real)
        .map_err(|e| format!("roxe run: cannot show the devices in /sys and /dev: {e}"))?;
    Ok(match made {
        namespace::Made::MountNamespace => "a mount namespace (root)".to_string(),
        namespace::Made::UserNamespace => "a user and mount namespace (unprivileged)".to_string(),
    })
}

/// The view written for the preload: the shim library and the view's root.
fn preloaded(
    the_view: &view::View,
    libs: &std::path::Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let shim = dropin::view_shim(libs)?;
    let base = roxe_provider::driver::stat::stat_dir()
        .map_err(|e| format!("roxe run: a directory for the view: {e}"))?;
    // One per run; the views of runs whose process is gone are removed.
    if let Ok(rd) = std::fs::read_dir(&base) {
        for e in rd.flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix("view-"));
            if pid.is_some_and(|p| !std::path::Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let root = base.join(format!("view-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    view::write_to(the_view, &root)
        .map_err(|e| format!("roxe run: writing the view in {}: {e}", root.display()))?;
    Ok((shim, root))
}
