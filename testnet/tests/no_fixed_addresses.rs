//! No test of the workspace picks a loopback address or a port of its own:
//! they all come from `roxe_testnet` (see its crate documentation), so no
//! two tests can claim the same one, whatever order or parallelism cargo
//! chooses. This reads every test, benchmark and example source and fails
//! on what would let two tests collide:
//!
//! - an IPv4 loopback address written out (`127.a.b.c`, in code or in a
//!   string), or the IPv6 one (`::1`, `Ipv6Addr::LOCALHOST`);
//! - a port number written out: a literal from 1024 to 65535 on a line that
//!   speaks of a port, or after `-p`/`--port` in an argument list (4791 and
//!   47910, the ports of the RoCEv2 protocol and of a device's claim, are
//!   not test choices);
//! - `std::env::set_var`/`remove_var` (the environment is shared by the
//!   tests of a process: give the child process its variables instead);
//! - a temporary path with a fixed name (`temp_dir().join("...")` without
//!   the process id or a lease in it).
//!
//! Comments are not read. A line that must name one anyway (a packet
//! builder that never opens a socket) says why with `testnet: allow` in a
//! comment on that line.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Every `.rs` file under a `tests`, `benches` or `examples` directory of
/// the workspace (not `target`, not test data).
fn test_sources(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, in_tests: bool, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                // (testnet's own check names what it looks for.)
                if name.starts_with('.') || matches!(name.as_str(), "target" | "data" | "testnet") {
                    continue;
                }
                let t = in_tests || matches!(name.as_str(), "tests" | "benches" | "examples");
                walk(&p, t, out);
            } else if in_tests && name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, false, &mut out);
    out.sort();
    out
}

/// `line` without its `//` comment (a `//` inside a string literal stays).
fn code_of(line: &str) -> &str {
    let b = line.as_bytes();
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// The `127.a.b.c` addresses written in `code`, and templates of them
/// (`"127.0.{}.{}"`).
fn loopback_literals(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("127.") {
        let before_ok = rest[..at]
            .chars()
            .last()
            .is_none_or(|c| !c.is_ascii_digit() && c != '.');
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_digit() || "{}.".contains(c)))
            .unwrap_or(tail.len());
        let cand = tail[..end].trim_end_matches('.');
        let next_is_octet = tail[4..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '{');
        if before_ok && next_is_octet && cand.split('.').count() >= 3 {
            found.push(cand.to_string());
        }
        rest = &rest[at + 4..];
    }
    found
}

/// The decimal literals of `code` (digits not part of a name or a longer
/// number, `_` separators allowed), with their values.
fn numbers(code: &str) -> Vec<u64> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
                i += 1;
            }
            let prev = start.checked_sub(1).map(|p| b[p]);
            let part_of_name = prev.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
            let part_of_float = prev == Some(b'.') || b.get(i) == Some(&b'.');
            if !part_of_name && !part_of_float {
                let digits: String = code[start..i].chars().filter(|c| *c != '_').collect();
                if let Ok(v) = digits.parse() {
                    out.push(v);
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Ports that are the protocol's, not a test's choice.
const PROTOCOL_PORTS: [u64; 2] = [4791, 47910];

/// The numbers written where a port is meant: after the word "port" up to
/// the next `,` or `;` (`let port = 7471 + k;`, `PORT: u16 = 7174`), or as
/// the argument after `-p`/`--port`.
fn port_literals(code: &str) -> Vec<u64> {
    let lower = code
        .to_ascii_lowercase()
        .replace("roxe_testnet::port", "                  ")
        .replace("portspace", "         ");
    let mut spans: Vec<&str> = Vec::new();
    for (at, _) in lower.match_indices("port") {
        let rest = &code[at + 4..];
        let end = rest.find([',', ';']).unwrap_or(rest.len());
        spans.push(&rest[..end]);
    }
    for flag in ["\"-p\"", "\"--port\""] {
        for (at, _) in code.match_indices(flag) {
            let rest = code[at + flag.len()..].trim_start_matches([',', ' ']);
            let end = rest
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ',' || c == ']' || c == ')')
                .map_or(rest.len(), |(i, _)| i);
            spans.push(&rest[..end]);
        }
    }
    spans
        .into_iter()
        .flat_map(numbers)
        .filter(|n| (1024..=65535).contains(n) && !PROTOCOL_PORTS.contains(n))
        .collect()
}

fn problems_in(path: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.contains("testnet: allow") {
            continue;
        }
        let code = code_of(line);
        let at = format!("{}:{}", path.display(), n + 1);
        for a in loopback_literals(code) {
            out.push(format!(
                "{at}: loopback address {a} written out: take it from roxe_testnet::addr()"
            ));
        }
        if [
            "Ipv4Addr::new(127",
            "Ipv4Addr::LOCALHOST",
            "[127,",
            "((127,",
        ]
        .iter()
        .any(|p| code.contains(p))
        {
            out.push(format!(
                "{at}: a loopback address built in code: take it from roxe_testnet::addr()"
            ));
        }
        if code.contains("\"::1\"")
            || code.contains("[::1]")
            || code.contains("Ipv6Addr::LOCALHOST")
        {
            out.push(format!(
                "{at}: ::1 written out: hold it with roxe_testnet::ipv6_loopback()"
            ));
        }
        for p in port_literals(code) {
            out.push(format!(
                "{at}: port {p} written out: take it from roxe_testnet::port()"
            ));
        }
        if code.contains("set_var(") || code.contains("remove_var(") {
            out.push(format!(
                "{at}: the process environment changed under parallel tests: set the child's"
            ));
        }
        if let Some(i) = code.find("temp_dir().join(\"") {
            let arg = &code[i + "temp_dir().join(\"".len()..];
            if !arg.split('"').next().unwrap_or("").contains('{') {
                out.push(format!(
                    "{at}: a temporary path with a fixed name: put the process id in it"
                ));
            }
        }
    }
    out
}

#[test]
fn no_test_names_its_own_address_or_port() {
    let root = workspace_root();
    let files = test_sources(&root);
    assert!(
        files.len() > 20,
        "found only {} test sources under {}",
        files.len(),
        root.display()
    );
    let mut problems = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(&root).unwrap_or(f);
        problems.extend(problems_in(rel, &text));
    }
    eprintln!("checked {} test sources", files.len());
    assert!(
        problems.is_empty(),
        "{} place(s) where two tests could collide:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check finds what it is for (and not what it is not).
#[test]
fn the_check_finds_each_kind() {
    let p = Path::new("x.rs");
    let bad = [
        r#"let a = open("x", "127.0.228.5");"#,
        r#"c.env("ROXE_ADDR", "127.0.0.1");"#,
        r#"let gid = "::ffff:127.0.40.3";"#,
        r#"let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));"#,
        r#"let port = 7471 + k;"#,
        r#"let server = format!("127.0.50.{}", 2 * net + 1);"#,
        r#"let a = IpAddr::V4(Ipv4Addr::new(127, 0, 9, 1));"#,
        r#"let caddr = IpAddr::from([127, 0, net, 1]);"#,
        r#"let args = ["-p", "28599", "--timeout", "1"];"#,
        r#"const PORT: u16 = 7174;"#,
        r#"let port = (18600 + u16::from(net)).to_string();"#,
        r#"    21000 + 10 * self.0 + i // the port"#,
        r#"std::env::set_var("ROXE_ADDR", a);"#,
        r#"let d = std::env::temp_dir().join("roxe-fixed");"#,
    ];
    for b in bad {
        // The comment in the seventh is cut before reading; the rest must
        // be found.
        let found = problems_in(p, b);
        if b.contains("21000") {
            assert!(found.is_empty(), "{b}: {found:?}");
        } else {
            assert!(!found.is_empty(), "not found: {b}");
        }
    }
    let good = [
        r#"let a = roxe_testnet::addr();"#,
        r#"let args = ["-s", "65536", "-n", "20000"];"#,
        r#"let a = ["-d", "roxe0", "-p", &port, "-g", "0", "-s", "8192", "-m", "1024"];"#,
        r#"// 127.0.0.1 in a comment"#,
        r#"let url = "http://x"; // port 8080"#,
        r#"assert_eq!(udp.dst_port, 4791);"#,
        r#"let v = 1.27;"#,
        r#"let (a, b) = (127.5, 3);"#,
        r#"let d = std::env::temp_dir().join(format!("roxe-{}", std::process::id()));"#,
        r#"let p = Ipv4Addr::new(127, 0, 0, 1); // testnet: allow (a packet, no socket)"#,
    ];
    for g in good {
        let found = problems_in(p, g);
        assert!(found.is_empty(), "{g}: {found:?}");
    }
}
