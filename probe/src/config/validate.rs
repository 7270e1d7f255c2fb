//! Validation of a [`ProbeConfig`]: every setting checked in a fixed order (the first
//! problem is the one reported), and the parts the runner needs resolved.

use std::time::Duration;

use hyper::http::uri::{Authority, PathAndQuery};

use super::error::Setting;
use super::{ConfigError, Kind, Parsed, ProbeConfig, MAX_DURATION, MAX_PLANNED_REQUESTS, MAX_RATE};

pub(super) fn parse(c: &ProbeConfig) -> Result<Parsed, ConfigError> {
    let authority = parse_target(&c.target)?;
    let host = host(c, &authority)?;
    check_labels(c)?;
    let planned = check_rates(c)?;
    check_durations(c)?;
    if planned > MAX_PLANNED_REQUESTS {
        return Err(ConfigError::new(
            Setting::Duration,
            format!(
                "the rates over {:?} plan {planned:.0} requests, more than the {MAX_PLANNED_REQUESTS:.0} one run keeps in memory; lower a rate or the duration",
                c.duration
            ),
        ));
    }
    check_limits(c)?;
    Ok(Parsed {
        connect_to: authority_connect_string(&authority),
        host,
        paths: paths(c)?,
    })
}

/// The `Host` / `:authority` value: the one given, checked, or the target's.
fn host(c: &ProbeConfig, authority: &Authority) -> Result<String, ConfigError> {
    match &c.host {
        None => Ok(authority.as_str().to_owned()),
        Some(h) => {
            h.parse::<Authority>().map_err(|e| {
                ConfigError::new(Setting::Host, format!("{h:?} is not a valid host: {e}"))
            })?;
            Ok(h.clone())
        }
    }
}

/// The traffic-path label and the proxy label.
fn check_labels(c: &ProbeConfig) -> Result<(), ConfigError> {
    if c.label.is_empty() || c.label.len() > 64 || !c.label.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            Setting::Label,
            format!(
                "{:?} must be 1 to 64 visible ASCII characters without spaces (e.g. ingress, service, pod-ip)",
                c.label
            ),
        ));
    }
    if let Some(proxy) = &c.proxy_label {
        if proxy.trim().is_empty()
            || proxy.chars().count() > 120
            || proxy.chars().any(char::is_control)
        {
            return Err(ConfigError::new(
                Setting::ProxyLabel,
                format!(
                    "{proxy:?} must be 1 to 120 printable characters (e.g. \"kube-proxy iptables 1.31\")"
                ),
            ));
        }
    }
    Ok(())
}

/// Each rate in range and not all 0; how many requests the run plans.
fn check_rates(c: &ProbeConfig) -> Result<f64, ConfigError> {
    let mut planned = 0.0;
    for kind in Kind::ALL {
        let rate = c.rate(kind);
        let setting = Setting::rate(kind);
        if !rate.is_finite() || rate < 0.0 {
            return Err(ConfigError::new(
                setting,
                format!("must be a number of requests per second ≥ 0 (0 sends none), got {rate}"),
            ));
        }
        if rate > MAX_RATE {
            return Err(ConfigError::new(
                setting,
                format!("{rate} per second is above the limit of {MAX_RATE}"),
            ));
        }
        planned += rate * c.duration.as_secs_f64();
    }
    if Kind::ALL.iter().all(|&k| c.rate(k) == 0.0) {
        return Err(ConfigError::new(
            Setting::ShortRate,
            "every rate is 0, so nothing would be sent; set --rate, --slow-rate or --stream-rate above 0".to_owned(),
        ));
    }
    Ok(planned)
}

/// Every duration in range; the slow and stream ones only when those kinds are sent.
fn check_durations(c: &ProbeConfig) -> Result<(), ConfigError> {
    check_duration(Setting::Duration, c.duration, Duration::from_millis(1))?;
    check_duration(Setting::DrainWait, c.drain_wait, Duration::ZERO)?;
    check_duration(
        Setting::ConnectTimeout,
        c.connect_timeout,
        Duration::from_millis(1),
    )?;
    if let Some(o) = c.on_off {
        check_duration(Setting::OnOff, o.on, Duration::from_millis(1))?;
        check_duration(Setting::OnOff, o.off, Duration::ZERO)?;
    }
    if c.slow_rate > 0.0 {
        check_duration(Setting::Slow, c.slow, Duration::ZERO)?;
    }
    if c.stream_rate > 0.0 {
        check_duration(Setting::Stream, c.stream, Duration::ZERO)?;
    }
    Ok(())
}

/// The in-flight cap and the idle connection limit.
fn check_limits(c: &ProbeConfig) -> Result<(), ConfigError> {
    if c.max_in_flight == 0 || c.max_in_flight > 100_000 {
        return Err(ConfigError::new(
            Setting::MaxInFlight,
            format!("must be between 1 and 100000, got {}", c.max_in_flight),
        ));
    }
    if c.max_idle > 100_000 {
        return Err(ConfigError::new(
            Setting::MaxIdle,
            format!("must be at most 100000, got {}", c.max_idle),
        ));
    }
    Ok(())
}

/// The request path of each kind, indexed like [`Kind::ALL`], checked.
fn paths(c: &ProbeConfig) -> Result<[String; 3], ConfigError> {
    let mut paths = [String::new(), String::new(), String::new()];
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        let path = c.path(kind);
        let setting = Setting::path(kind);
        if !path.starts_with('/') {
            return Err(ConfigError::new(
                setting,
                format!("{path:?} must start with /"),
            ));
        }
        path.parse::<PathAndQuery>()
            .map_err(|e| ConfigError::new(setting, format!("{path:?} is not a valid path: {e}")))?;
        paths[i] = path;
    }
    Ok(paths)
}

fn check_duration(setting: Setting, d: Duration, min: Duration) -> Result<(), ConfigError> {
    if d < min {
        return Err(ConfigError::new(
            setting,
            format!(
                "must be at least {}, got {}",
                humantime::format_duration(min),
                humantime::format_duration(d)
            ),
        ));
    }
    if d > MAX_DURATION {
        return Err(ConfigError::new(
            setting,
            format!("must be at most 24h, got {}", humantime::format_duration(d)),
        ));
    }
    Ok(())
}

fn parse_target(target: &str) -> Result<Authority, ConfigError> {
    let bad = |why: String| ConfigError::new(Setting::Target, why);
    let trimmed = target.trim();
    if trimmed.is_empty() {
        return Err(bad(
            "is empty; give host:port or http://host:port".to_owned()
        ));
    }
    let (rest, default_port) = if let Some((scheme, rest)) = trimmed.split_once("://") {
        match scheme.to_ascii_lowercase().as_str() {
            "http" => (rest, Some(80)),
            "https" => {
                return Err(bad(format!(
                    "{target:?}: https is not supported; point the probe at a plain HTTP port (a Service port, a Pod IP or a port-forward)"
                )))
            }
            other => return Err(bad(format!("{target:?}: unsupported scheme {other:?}; use http:// or host:port"))),
        }
    } else {
        (trimmed, None)
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') || rest.contains('?') {
        return Err(bad(format!(
            "{target:?} has a path; give only host:port and set paths with --path, --slow-path, --stream-path"
        )));
    }
    if rest.contains('@') {
        return Err(bad(format!(
            "{target:?}: user information is not supported"
        )));
    }
    let port_text = match rest.strip_prefix('[') {
        Some(v6) => v6.split_once(']').and_then(|(_, p)| p.strip_prefix(':')),
        None => rest.rsplit_once(':').map(|(_, p)| p),
    };
    if let Some(port) = port_text {
        if port.parse::<u16>().is_err() {
            return Err(bad(format!(
                "{target:?}: port {port:?} is not a number from 1 to 65535"
            )));
        }
    }
    let authority: Authority = rest
        .parse()
        .map_err(|e| bad(format!("{target:?} is not host:port: {e}")))?;
    if authority.host().is_empty() {
        return Err(bad(format!("{target:?} has no host")));
    }
    match (authority.port_u16(), default_port) {
        (Some(0), _) => Err(bad(format!(
            "{target:?}: port 0 is not a port to connect to"
        ))),
        (Some(_), _) => Ok(authority),
        (None, Some(port)) => format!("{}:{port}", authority.host())
            .parse()
            .map_err(|e| bad(format!("{target:?}: {e}"))),
        (None, None) => Err(bad(format!(
            "{target:?} has no port; give host:port (e.g. {}:8080)",
            authority.host()
        ))),
    }
}

fn authority_connect_string(authority: &Authority) -> String {
    // `host()` keeps the brackets of an IPv6 literal, which `SocketAddr` parsing expects.
    format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_into_connect_strings() {
        for (input, want) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
            ("http://svc.ns.svc", "svc.ns.svc:80"),
            ("[::1]:9000", "[::1]:9000"),
            ("HTTP://localhost:1", "localhost:1"),
        ] {
            let config = ProbeConfig::new(input);
            assert_eq!(config.parse().unwrap().connect_to, want, "{input}");
        }
    }

    #[test]
    fn bad_targets_say_what_to_give() {
        for (input, needle) in [
            ("", "empty"),
            ("localhost", "no port"),
            ("https://x:1", "https is not supported"),
            ("ftp://x:1", "unsupported scheme"),
            ("x:1/api", "has a path"),
            ("x:0", "port 0"),
            ("x:notaport", "is not a number"),
            ("x:99999", "is not a number"),
            ("[::1", "not host:port"),
        ] {
            let err = ProbeConfig::new(input).validate().unwrap_err();
            assert_eq!(err.flag(), "--target");
            assert!(err.to_string().contains(needle), "{input}: {err}");
        }
    }
}
