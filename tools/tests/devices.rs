//! `roxe devices` as a user runs it: the backend column, `ROXE_BACKEND`,
//! and the one line that says why no hardware device is listed.

use std::process::{Command, Output};

/// `roxe devices` with a configured address (listing opens nothing, but
/// keep it ours) and `env`; the address too.
fn roxe_devices_at(env: &[(&str, &str)]) -> (Output, String) {
    let addr = roxe_testnet::addr().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_roxe"));
    cmd.arg("devices")
        .env_remove("ROXE_BACKEND")
        .env_remove("ROXE_SYSTEM_LIBIBVERBS")
        .env("ROXE_ADDR", &addr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.output().expect("run roxe devices"), addr)
}

fn roxe_devices(env: &[(&str, &str)]) -> Output {
    roxe_devices_at(env).0
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn soft_devices_are_listed_with_their_backend() {
    let (o, addr) = roxe_devices_at(&[]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("backend"), "{out}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("roxe0"))
        .unwrap_or_else(|| panic!("no roxe0 line:\n{out}"));
    assert!(line.contains("soft") && line.contains(&addr), "{line}");
}

#[test]
fn a_missing_system_library_is_one_line_and_no_failure() {
    let o = roxe_devices(&[("ROXE_SYSTEM_LIBIBVERBS", "/nonexistent/libibverbs.so.1")]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    let why: Vec<&str> = out.lines().filter(|l| l.starts_with("hardware:")).collect();
    assert_eq!(why.len(), 1, "{out}");
    assert!(
        why[0].contains("ROXE_SYSTEM_LIBIBVERBS") && why[0].contains("no such file"),
        "{out}"
    );
}

#[test]
fn roxe_backend_selects_what_is_offered() {
    // Hardware only: no soft device; on a machine without RDMA devices
    // the list is empty and the reason line says so.
    let o = roxe_devices(&[("ROXE_BACKEND", "hardware")]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(!out.contains("roxe0"), "{out}");
    for l in out.lines().skip(2).filter(|l| !l.starts_with("hardware:")) {
        assert!(l.contains("hardware"), "a non-hardware device listed: {l}");
    }
    let o = roxe_devices(&[("ROXE_BACKEND", "soft")]);
    assert!(stdout(&o).contains("roxe0"));
    let o = roxe_devices(&[("ROXE_BACKEND", "mlx5")]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("expected soft, hardware or auto"),
        "{o:?}"
    );
}

/// A device whose address is chosen at open shows the GUID of the address
/// it would take (not 0, as before any open it used to).
#[test]
fn an_auto_device_shows_a_guid() {
    let o = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("devices")
        .env_remove("ROXE_ADDR")
        .env("ROXE_BACKEND", "soft")
        .output()
        .expect("run roxe devices");
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("roxe0"))
        .unwrap_or_else(|| panic!("{out}"));
    let guid = line.split_whitespace().nth(1).unwrap();
    assert_ne!(guid, "0000000000000000", "{line}");
    assert!(guid.starts_with("ffff7f"), "a 127.x address's GUID: {line}");
}

/// `roxe devices | head -1`: the tool ends quietly when its reader goes.
#[test]
fn a_closed_pipe_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("devices")
        .env("ROXE_ADDR", roxe_testnet::addr().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roxe devices");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

/// `roxe --help` lists every `ROXE_*` variable the sources read.
#[test]
fn help_lists_every_environment_variable() {
    let o = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("--help")
        .output()
        .expect("run roxe --help");
    let help = stdout(&o);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut read = std::collections::BTreeSet::new();
    for dir in [
        "provider/src",
        "verbs-api/src",
        "verbs-api/capi/src",
        "tools/src",
    ] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (i, _) in text.match_indices("\"ROXE_") {
                        let name: String = text[i + 1..]
                            .chars()
                            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                            .collect();
                        read.insert(name);
                    }
                }
            }
        }
    }
    assert!(read.len() >= 8, "found {read:?}");
    for v in &read {
        assert!(
            help.contains(v.as_str()),
            "roxe --help does not list {v}:\n{help}"
        );
    }
}

/// Every variable is also an option (clap's env support): given on the
/// command line, before or after the subcommand, it configures the devices
/// as the variable would.
#[test]
fn environment_options_configure_the_devices() {
    let [a, b] = roxe_testnet::addrs().map(|a| a.to_string());
    for args in [
        &["--roxe-addr", &a, "devices"][..],
        &["devices", "--roxe-addr", &b][..],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_roxe"))
            .args(args)
            .env_remove("ROXE_ADDR")
            .output()
            .expect("run roxe devices");
        let out = stdout(&o);
        let want = args[if args[0] == "devices" { 2 } else { 1 }];
        assert!(o.status.success() && out.contains(want), "{args:?}: {out}");
    }
}
