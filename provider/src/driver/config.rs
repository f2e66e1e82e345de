//! Device configuration: the address, the receive-side ICRC policy, the
//! pcap tap, the fault injector and the pacing knobs, from code or from the
//! environment (`ROXE_ADDR`, `ROXE_ICRC`, `ROXE_PCAP`, `ROXE_FAULT`, and
//! those of [`PacingConfig`]).

use super::pacing::PacingConfig;
use std::net::IpAddr;
use std::path::PathBuf;

/// Configuration errors (a bad environment variable names itself).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A variable's value could not be parsed.
    #[error("{var}: {msg}")]
    Invalid {
        /// The variable (or option) at fault.
        var: &'static str,
        /// What is wrong with it.
        msg: String,
    },
}

fn invalid(var: &'static str, msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        var,
        msg: msg.into(),
    }
}

/// How received IPv4 packets' ICRCs are treated. IPv6 ICRCs are always
/// verified: a UDP socket hands over every field they cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcMode {
    /// Not checked.
    Off,
    /// Checked assuming the sender's IPv4 identification is 0 (Linux's
    /// choice for an unconnected don't-fragment socket, which is how roxe
    /// sends); a mismatch is counted and the packet accepted. The default:
    /// rxe and mlx5 send non-zero identifications, which a UDP socket
    /// never shows, and the UDP checksum already guards against corruption.
    #[default]
    Warn,
    /// Checked as for `Warn`, and a mismatch drops the packet: right
    /// between roxe devices, wrong for rxe and NIC peers.
    Strict,
    /// Received from an `AF_PACKET` socket (needs `CAP_NET_RAW`), which
    /// shows the real IPv4 header: every ICRC is verified exactly, whatever
    /// the sender's identification, and a mismatch drops the packet. The
    /// UDP socket stays bound (no ICMP port unreachable) but what it
    /// receives is discarded. IPv6 devices verify fully from their UDP
    /// socket and open no raw socket.
    Raw,
}

impl std::str::FromStr for IcrcMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "off" => Ok(IcrcMode::Off),
            "warn" => Ok(IcrcMode::Warn),
            "strict" => Ok(IcrcMode::Strict),
            "raw" => Ok(IcrcMode::Raw),
            _ => Err(invalid(
                "ROXE_ICRC",
                format!("{s:?}: expected off, warn, strict or raw"),
            )),
        }
    }
}

/// Faults injected on transmit (`ROXE_FAULT`), so programs can be tested
/// under loss on real sockets. Probabilities are per packet.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultSpec {
    /// Drop the packet.
    pub loss: f64,
    /// Send it twice.
    pub dup: f64,
    /// Hold it back so that later packets overtake it.
    pub reorder: f64,
    /// Flip one bit (the receiver's ICRC or UDP checksum must reject it).
    pub corrupt: f64,
    /// Delay every packet by this many nanoseconds.
    pub delay_ns: u64,
    /// Seed of the injector's random choices (mixed with the device's
    /// address: two devices given one spec draw different faults).
    pub seed: u64,
}

impl std::str::FromStr for FaultSpec {
    type Err = ConfigError;
    /// `loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,delay=50us,seed=N`;
    /// every key optional.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        const VAR: &str = "ROXE_FAULT";
        let mut f = FaultSpec {
            seed: 0x726f_7865,
            ..FaultSpec::default()
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| invalid(VAR, format!("{item:?}: expected key=value")))?;
            let prob = |v: &str| -> Result<f64, ConfigError> {
                let p: f64 = v
                    .parse()
                    .map_err(|_| invalid(VAR, format!("{k}={v}: not a number")))?;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(invalid(VAR, format!("{k}={v}: a probability is 0..1")))
                }
            };
            match k {
                "loss" => f.loss = prob(v)?,
                "dup" => f.dup = prob(v)?,
                "reorder" => f.reorder = prob(v)?,
                "corrupt" => f.corrupt = prob(v)?,
                "delay" => {
                    f.delay_ns = parse_duration_ns(v).ok_or_else(|| {
                        invalid(VAR, format!("delay={v}: expected e.g. 50us, 2ms, 100ns"))
                    })?
                }
                "seed" => {
                    f.seed = v
                        .parse()
                        .map_err(|_| invalid(VAR, format!("seed={v}: not an integer")))?
                }
                _ => return Err(invalid(VAR, format!("unknown key {k:?}"))),
            }
        }
        Ok(f)
    }
}

/// `50us`, `2ms`, `1s`, `100ns` or a bare number of nanoseconds.
fn parse_duration_ns(v: &str) -> Option<u64> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult = match unit {
        "" | "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Everything a soft device is opened with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceConfig {
    /// The device's address; `None`: the first free loopback address from
    /// 127.0.0.1 upward.
    pub addr: Option<IpAddr>,
    /// Receive-side IPv4 ICRC policy.
    pub icrc: IcrcMode,
    /// Write every packet sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Inject faults on transmit.
    pub fault: Option<FaultSpec>,
    /// When the device's threads send, receive and sleep: busy polling,
    /// GSO, callers receiving, ACK-clocked passes, coalescing (see
    /// [`PacingConfig`], each knob with its `ROXE_*` variable).
    pub pacing: PacingConfig,
    /// Hold the address alone (`ROXE_SHARE=off`), as before addresses
    /// were shared: a second process opening it fails with EADDRINUSE.
    /// By default a configured address is shared with the user's other
    /// processes (each its own slot of the QPN space, see `steering`); an
    /// automatic address is always the process's own.
    pub exclusive: bool,
    /// No selective recovery towards roxe peers on this host
    /// (`ROXE_SELECTIVE=off`; `EngineConfig::keep_early`): plain
    /// go-back-N, as towards any other peer.
    pub go_back_n_only: bool,
}

/// An on/off switch from the environment: `1`, `on`, `true`, `yes` or `0`,
/// `off`, `false`, `no` (any case); anything else is an error naming the
/// variable.
pub fn parse_switch(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        v => Err(invalid(
            var,
            format!("{v:?}: expected 1/0, on/off, true/false or yes/no"),
        )),
    }
}

/// A whole number of microseconds from 0 to `max`; anything else is an
/// error naming the variable.
pub fn parse_micros(var: &'static str, value: &str, max: u32) -> Result<u32, ConfigError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|&us| us <= max)
        .ok_or_else(|| {
            invalid(
                var,
                format!("{value:?}: expected microseconds from 0 (off) to {max}"),
            )
        })
}

impl DeviceConfig {
    /// The configuration the environment describes: `ROXE_ADDR` (the first
    /// address if it lists several), `ROXE_SHARE=on|off`, `ROXE_SELECTIVE=on|off`, `ROXE_ICRC=off|warn|strict|raw`,
    /// `ROXE_PCAP=FILE`, `ROXE_FAULT=...`, and the pacing knobs
    /// ([`PacingConfig::from_env`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self::all_from_env()?.into_iter().next().unwrap_or_default())
    }

    /// One configuration per address in `ROXE_ADDR` (comma-separated: one
    /// device each, `roxe0`, `roxe1`, ...), or a single automatic one.
    pub fn all_from_env() -> Result<Vec<Self>, ConfigError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut base = DeviceConfig::default();
        if let Some(v) = var("ROXE_ICRC") {
            base.icrc = v.parse()?;
        }
        base.pcap = var("ROXE_PCAP").map(PathBuf::from);
        if let Some(v) = var("ROXE_FAULT") {
            base.fault = Some(v.parse()?);
        }
        base.pacing = PacingConfig::from_env()?;
        if let Some(v) = var("ROXE_SHARE") {
            base.exclusive = !parse_switch("ROXE_SHARE", &v)?;
        }
        if let Some(v) = var("ROXE_SELECTIVE") {
            base.go_back_n_only = !parse_switch("ROXE_SELECTIVE", &v)?;
        }
        let Some(addrs) = var("ROXE_ADDR") else {
            return Ok(vec![base]);
        };
        let mut out = Vec::new();
        for (i, a) in addrs.split(',').map(str::trim).enumerate() {
            let addr: IpAddr = a
                .parse()
                .map_err(|_| invalid("ROXE_ADDR", format!("{a:?}: not an IP address")))?;
            let mut c = base.clone();
            c.addr = Some(addr);
            if i > 0 {
                // One capture file per device.
                c.pcap = base.pcap.as_ref().map(|p| {
                    let mut s = p.clone().into_os_string();
                    s.push(format!(".{i}"));
                    PathBuf::from(s)
                });
            }
            out.push(c);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_spec_parses_every_key_and_rejects_junk() {
        let f: FaultSpec = "loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,delay=50us,seed=7"
            .parse()
            .unwrap();
        assert_eq!(
            f,
            FaultSpec {
                loss: 0.01,
                dup: 0.001,
                reorder: 0.01,
                corrupt: 0.001,
                delay_ns: 50_000,
                seed: 7
            }
        );
        assert!("loss=2".parse::<FaultSpec>().is_err());
        assert!("loss".parse::<FaultSpec>().is_err());
        assert!("delay=5parsecs".parse::<FaultSpec>().is_err());
        assert!("jitter=1".parse::<FaultSpec>().is_err());
        assert_eq!("".parse::<FaultSpec>().unwrap().loss, 0.0);
    }

    #[test]
    fn switches_share_one_syntax() {
        for on in ["1", "on", "ON", "true", "yes"] {
            assert_eq!(parse_switch("ROXE_GSO", on), Ok(true), "{on}");
        }
        for off in ["0", "off", "False", "no"] {
            assert_eq!(parse_switch("ROXE_GSO", off), Ok(false), "{off}");
        }
        let e = parse_switch("ROXE_BUSY_POLL", "maybe").unwrap_err();
        assert!(e.to_string().contains("ROXE_BUSY_POLL"), "{e}");
    }

    #[test]
    fn microseconds_parse_within_their_bound() {
        assert_eq!(parse_micros("ROXE_RX_COALESCE_US", "0", 1000), Ok(0));
        assert_eq!(parse_micros("ROXE_RX_COALESCE_US", " 20 ", 1000), Ok(20));
        assert_eq!(parse_micros("ROXE_RX_COALESCE_US", "1000", 1000), Ok(1000));
        for bad in ["1001", "-1", "20us", "", "off"] {
            let e = parse_micros("ROXE_RX_COALESCE_US", bad, 1000).unwrap_err();
            assert!(e.to_string().contains("ROXE_RX_COALESCE_US"), "{bad}: {e}");
        }
    }

    #[test]
    fn icrc_modes() {
        assert_eq!("strict".parse::<IcrcMode>(), Ok(IcrcMode::Strict));
        assert_eq!("raw".parse::<IcrcMode>(), Ok(IcrcMode::Raw));
        assert!("maybe".parse::<IcrcMode>().is_err());
    }
}
