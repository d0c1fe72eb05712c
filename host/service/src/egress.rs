//! What tenants' connectors may reach (`--egress-allow`): a Kafka source or sink and a
//! PostgreSQL sink open connections from the server's (and the workers') network, so without a
//! policy a tenant could point one at anything that network reaches: a database of another
//! team, a cloud metadata endpoint, the coordinator's own port.
//!
//! A policy is a list of rules, each a host name, an IP address or a CIDR block, with or
//! without a port: `10.0.0.0/8`, `kafka.internal:9092`, `*:5432`, `[fd00::/8]:9092`. A target
//! passes when every address its host resolves to matches a rule (a rule naming a host by
//! name matches that name, whatever it resolves to: the operator trusts the name). Without a
//! policy every target passes, except one: the server's own port on this machine is never a
//! connector's target.
//!
//! The check runs when a connection is stored and each time a job is placed. The connector
//! resolves the name again when it connects, and a Kafka client also dials the brokers the
//! bootstrap brokers advertise, which the policy does not see (rdkafka has no resolve hook):
//! network rules beside the server remain the wall; this is the check that names the problem.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use ipnet::IpNet;

/// Most rules a policy holds.
pub const MAX_RULES: usize = 256;

/// What a rule matches, host-wise.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hosts {
    /// Any host.
    Any,
    /// This name (lower case), whatever it resolves to.
    Name(String),
    /// Addresses in this block (a single address is a /32 or /128).
    Net(IpNet),
}

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    hosts: Hosts,
    /// `None`: every port.
    port: Option<u16>,
}

/// The egress policy of a server.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    /// `None`: everything is allowed (no `--egress-allow`).
    allow: Option<Vec<Rule>>,
    /// The list as given, for messages.
    text: String,
    /// The server's own listening address, never a target.
    own: Option<SocketAddr>,
}

impl EgressPolicy {
    /// Everything allowed.
    pub fn open() -> EgressPolicy {
        EgressPolicy::default()
    }

    /// Parses `--egress-allow`: rules separated by commas.
    pub fn parse(text: &str) -> Result<EgressPolicy, String> {
        let entries: Vec<&str> = text.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
        if entries.is_empty() {
            return Err("--egress-allow lists no rule: give hosts, addresses or CIDRs, with or without `:port`".into());
        }
        if entries.len() > MAX_RULES {
            return Err(format!("--egress-allow has {} rules, above {MAX_RULES}", entries.len()));
        }
        let allow = entries.iter().map(|e| rule(e)).collect::<Result<Vec<_>, _>>()?;
        Ok(EgressPolicy { allow: Some(allow), text: entries.join(","), own: None })
    }

    /// The same policy, which also keeps connectors off `own` (the server's listening address).
    pub fn serving_at(mut self, own: SocketAddr) -> EgressPolicy {
        self.own = Some(own);
        self
    }

    /// Whether a policy restricts anything beyond the server's own port.
    pub fn is_open(&self) -> bool {
        self.allow.is_none()
    }

    /// Checks that `host:port` may be reached, resolving `host` (blocking). The error names the
    /// target, the address that failed and the policy.
    pub fn check(&self, host: &str, port: u16) -> Result<(), String> {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        let named = |r: &Rule| r.port.is_none_or(|p| p == port) && matches!(&r.hosts, Hosts::Name(n) if *n == host);
        let named_allowed = self.allow.as_ref().is_some_and(|rules| rules.iter().any(named));
        let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => match (host.as_str(), port).to_socket_addrs() {
                Ok(found) => found.map(|a| a.ip()).collect(),
                // A name may resolve only where the connector runs: without a policy, or with
                // one that names it, the connector finds out.
                Err(_) if named_allowed || self.allow.is_none() => return Ok(()),
                Err(e) => return Err(self.outside(&format!("`{host}:{port}` (which does not resolve here: {e})"))),
            },
        };
        if let Some(own) = self.own
            && port == own.port()
            && addresses.iter().any(|ip| ip.is_loopback() || *ip == own.ip() || own.ip().is_unspecified())
        {
            return Err(format!("`{host}:{port}` is this server's own port; a connector may not reach it"));
        }
        let Some(rules) = &self.allow else { return Ok(()) };
        if named_allowed {
            return Ok(());
        }
        for ip in &addresses {
            let fits = |r: &Rule| {
                r.port.is_none_or(|p| p == port)
                    && match &r.hosts {
                        Hosts::Any => true,
                        Hosts::Net(net) => net.contains(ip),
                        Hosts::Name(_) => false,
                    }
            };
            if !rules.iter().any(fits) {
                let via = if host.parse::<IpAddr>().is_ok() { String::new() } else { format!(" (as {ip})") };
                return Err(self.outside(&format!("`{host}:{port}`{via}")));
            }
        }
        if addresses.is_empty() {
            return Err(format!("`{host}:{port}` resolves to no address"));
        }
        Ok(())
    }

    fn outside(&self, target: &str) -> String {
        format!(
            "{target} is outside the server's egress policy (--egress-allow {}); ask the operator to allow it",
            self.text
        )
    }
}

/// One rule: `HOST`, `HOST:PORT`, `[V6]:PORT`, `CIDR`, `CIDR:PORT`, `[V6CIDR]:PORT`, `*:PORT`.
fn rule(entry: &str) -> Result<Rule, String> {
    let bad = |why: &str| format!("--egress-allow `{entry}`: {why}");
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or_else(|| bad("no closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| bad("`]` must be followed by `:port`"))?),
        };
        (inside, port)
    } else if entry.matches(':').count() > 1 {
        // An IPv6 address or block without brackets takes no port.
        (entry, None)
    } else {
        match entry.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    let port = port
        .map(|p| p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| bad("the port is not 1-65535")))
        .transpose()?;
    let hosts = if host == "*" {
        Hosts::Any
    } else if let Ok(net) = host.parse::<IpNet>() {
        Hosts::Net(net.trunc())
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        Hosts::Net(IpNet::from(ip))
    } else if is_host_name(host) {
        Hosts::Name(host.to_ascii_lowercase())
    } else {
        return Err(bad("not a host name, an IP address or a CIDR block"));
    };
    if hosts == Hosts::Any && port.is_none() {
        return Err(bad("`*` needs a port (`*:9092`); to allow everything, give no --egress-allow"));
    }
    Ok(Rule { hosts, port })
}

fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
        })
}

/// The `(host, port)` pairs of a `host:port[,host:port...]` broker list.
pub fn broker_targets(brokers: &str) -> Result<Vec<(String, u16)>, String> {
    brokers.split(',').map(str::trim).filter(|b| !b.is_empty()).map(|b| host_port(b, None)).collect()
}

/// The `(host, port)` pairs a `postgresql://` URL connects to. Parameters that would choose a
/// host or socket other than the URL's own (`host`, `hostaddr`, `port`) are refused, and so is
/// a Unix socket: they would let a tenant reach what the URL does not show.
pub fn postgres_targets(url: &str) -> Result<Vec<(String, u16)>, String> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .ok_or("the URL must start with `postgresql://`")?;
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        if ["host", "hostaddr", "port"].contains(&key) {
            return Err(format!("the URL's `{key}` parameter is not accepted here: name the host in the URL itself"));
        }
    }
    let authority = before_query.split('/').next().unwrap_or("");
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hosts.is_empty() || hosts.starts_with('%') {
        return Err("the URL names no host (a Unix socket is not accepted here)".into());
    }
    hosts.split(',').map(|h| host_port(h, Some(5432))).collect()
}

/// `host:port` (or `[v6]:port`), the port optional when there is a default.
fn host_port(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']').ok_or_else(|| format!("`{text}`: no closing `]`"))?;
            (inside, after.strip_prefix(':'))
        }
        None => match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        },
    };
    let port = match (port, default_port) {
        (Some(p), _) => p.parse::<u16>().map_err(|_| format!("`{text}`: the port is not a number 0-65535"))?,
        (None, Some(d)) => d,
        (None, None) => return Err(format!("`{text}` has no port: give `host:port`")),
    };
    if host.is_empty() {
        return Err(format!("`{text}` names no host"));
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_by_block_name_and_port_as_their_definition_says() {
        let policy =
            EgressPolicy::parse("10.0.0.0/8, kafka.internal:9092, *:5432, [fd00::/8]:9093, 192.0.2.7").unwrap();
        // (host, port, allowed): written from the rules above, one case per clause.
        let table = [
            ("10.1.2.3", 9092, true),
            ("10.255.255.255", 1, true),
            ("11.0.0.1", 9092, false),
            ("kafka.internal", 9092, true),
            ("KAFKA.internal", 9092, true),
            ("kafka.internal", 9093, false),
            ("8.8.8.8", 5432, true),
            ("8.8.8.8", 5433, false),
            ("[fd00::1]", 9093, true),
            ("fd00::1", 9092, false),
            ("192.0.2.7", 80, true),
            ("192.0.2.8", 80, false),
            ("127.0.0.1", 9092, false),
            ("localhost", 9092, false),
        ];
        for (host, port, allowed) in table {
            let got = policy.check(host, port);
            assert_eq!(got.is_ok(), allowed, "{host}:{port}: {got:?}");
            if let Err(e) = got {
                assert!(e.contains("--egress-allow 10.0.0.0/8,kafka.internal:9092"), "{e}");
            }
        }
    }

    #[test]
    fn the_servers_own_port_is_refused_with_or_without_a_policy() {
        let own: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        for policy in [EgressPolicy::open(), EgressPolicy::parse("127.0.0.0/8").unwrap()] {
            let policy = policy.serving_at(own);
            for host in ["127.0.0.1", "localhost", "[::1]"] {
                let e = policy.check(host, 7000).unwrap_err();
                assert!(e.contains("own port"), "{e}");
            }
            assert!(policy.check("127.0.0.1", 7001).is_ok());
        }
        assert!(EgressPolicy::open().check("127.0.0.1", 7000).is_ok(), "no server address, no own port");
    }

    #[test]
    fn bad_rules_are_refused_naming_the_rule() {
        for (text, says) in [
            ("", "no rule"),
            ("*", "needs a port"),
            ("10.0.0.0/8:0", "1-65535"),
            ("host:99999", "1-65535"),
            ("[::1", "closing"),
            ("a b", "not a host name"),
            ("under_score.example", "not a host name"),
        ] {
            let e = EgressPolicy::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        let many = vec!["10.0.0.1"; MAX_RULES + 1].join(",");
        assert!(EgressPolicy::parse(&many).unwrap_err().contains("above"));
    }

    #[test]
    fn targets_are_read_from_broker_lists_and_urls_without_hidden_hosts() {
        assert_eq!(
            broker_targets("a:1, [::1]:2,b:3").unwrap(),
            vec![("a".into(), 1), ("::1".into(), 2), ("b".into(), 3)]
        );
        assert!(broker_targets("a").unwrap_err().contains("no port"));
        assert_eq!(postgres_targets("postgresql://u@db:6000/x?sslmode=disable").unwrap(), vec![("db".into(), 6000)]);
        assert_eq!(postgres_targets("postgres://u:p@h1,h2:7/x").unwrap(), vec![("h1".into(), 5432), ("h2".into(), 7)]);
        for (url, says) in [
            ("postgresql://u@db/x?host=/var/run/postgresql", "`host` parameter"),
            ("postgresql://u@db/x?sslmode=require&hostaddr=127.0.0.1", "`hostaddr`"),
            ("postgresql:///x", "no host"),
            ("postgresql://%2Fvar%2Frun/x", "Unix socket"),
            ("mysql://h/x", "postgresql://"),
        ] {
            let e = postgres_targets(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
