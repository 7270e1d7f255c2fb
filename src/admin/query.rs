//! Strict query-string parsing for the admin routes.
//!
//! Hand-written rather than a serde extractor so that every refusal names the parameter and
//! says what is accepted, and so that duplicates and empty names are refused instead of one of
//! them silently winning.

use std::fmt;
use std::str::FromStr;

use crate::vocab::error::ConfigError;
use crate::vocab::phase::Phase;

/// The parameters of one request, each known name at most once.
#[derive(Debug, Default)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    /// Parses `raw` (the part after `?`, if any), accepting only the names in `known`.
    ///
    /// Empty segments (`?&&`) are ignored; an empty name (`?=x`), a duplicate name, an unknown
    /// name or a malformed percent-escape is an error whose message is sent as the 400 body.
    pub(crate) fn parse(raw: Option<&str>, route: &str, known: &[&str]) -> Result<Self, String> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let Some(raw) = raw else {
            return Ok(Self { pairs });
        };
        for segment in raw.split('&') {
            if segment.is_empty() {
                continue;
            }
            let (name, value) = match segment.split_once('=') {
                Some((n, v)) => (n, v),
                None => (segment, ""),
            };
            let name = decode(name).map_err(|e| format!("malformed query string: {e}"))?;
            if name.is_empty() {
                return Err(format!(
                    "malformed query string: empty parameter name in `{}`",
                    shorten(segment)
                ));
            }
            if !known.contains(&name.as_str()) {
                let expected = if known.is_empty() {
                    format!("{route} takes no parameters")
                } else {
                    format!("{route} accepts {}", known.join(", "))
                };
                return Err(format!(
                    "unknown query parameter `{}`: {expected}",
                    shorten(&name)
                ));
            }
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(format!("duplicate query parameter `{name}`: give it once"));
            }
            let value = decode(value)
                .map_err(|e| format!("malformed value for query parameter `{name}`: {e}"))?;
            pairs.push((name, value));
        }
        Ok(Self { pairs })
    }

    /// The value of `name`, if given (`Some("")` for `?verbose`).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean flag: absent → `false`; `?verbose`, `=1`, `=true` → `true`; `=0`, `=false` →
    /// `false`; anything else is an error naming it.
    pub(crate) fn flag(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(false),
            Some("" | "1" | "true") => Ok(true),
            Some("0" | "false") => Ok(false),
            Some(other) => Err(format!(
                "invalid value `{}` for query parameter `{name}`: \
                 expected no value, true, false, 1 or 0",
                shorten(other)
            )),
        }
    }
}

/// Percent-decodes a query component (`+` is a space, as in forms).
fn decode(raw: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .ok_or_else(|| format!("incomplete percent-escape in `{}`", shorten(raw)))?;
                let hi = hex_val(hex[0]);
                let lo = hex_val(hex[1]);
                match (hi, lo) {
                    (Some(h), Some(l)) => out.push(h << 4 | l),
                    _ => return Err(format!("invalid percent-escape in `{}`", shorten(raw))),
                }
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("`{}` is not UTF-8 once decoded", shorten(raw)))
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Error messages quote client input; keep them one short line whatever was sent.
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 64;
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX + 1)
        .collect();
    if clean.chars().count() > MAX {
        let mut cut: String = clean.chars().take(MAX).collect();
        cut.push('…');
        cut
    } else {
        clean
    }
}

/// What `/drain` waits for before answering (its `wait` parameter).
///
/// # Examples
///
/// ```
/// use lameduck::admin::Wait;
///
/// assert_eq!("propagated".parse::<Wait>().unwrap(), Wait::Propagated);
/// assert_eq!(Wait::default(), Wait::Drained);
/// assert!("soon".parse::<Wait>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wait {
    /// Answer at once, with `202 Accepted`.
    None,
    /// Answer once the drain stopped accepting (phase
    /// [`StoppedAccepting`](crate::Phase::StoppedAccepting)): load balancers had their window.
    Propagated,
    /// Answer once the drain is over (phase [`Done`](crate::Phase::Done)): in-flight work
    /// finished or was cut, closers ran. The default, and what a `preStop` hook wants: kubelet
    /// sends SIGTERM only after the hook returns.
    #[default]
    Drained,
}

impl Wait {
    /// The value as it appears in the query string (`none`, `propagated`, `drained`).
    pub fn as_str(self) -> &'static str {
        match self {
            Wait::None => "none",
            Wait::Propagated => "propagated",
            Wait::Drained => "drained",
        }
    }

    /// The phase that satisfies the wait, if any.
    pub(crate) fn phase(self) -> Option<Phase> {
        match self {
            Wait::None => None,
            Wait::Propagated => Some(Phase::StoppedAccepting),
            Wait::Drained => Some(Phase::Done),
        }
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Wait {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The names come from `as_str`, the one table.
        [Wait::None, Wait::Propagated, Wait::Drained]
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| {
                ConfigError::parse(format!(
                    "`{}` is not a wait condition: expected none, propagated or drained",
                    shorten(s)
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAIN: &[&str] = &["wait", "timeout"];

    #[test]
    fn accepts_known_names_and_decodes() {
        let p = Params::parse(Some("wait=none&timeout=1%35s&&"), "/drain", DRAIN).unwrap();
        assert_eq!(p.get("wait"), Some("none"));
        assert_eq!(p.get("timeout"), Some("15s"));
        assert!(Params::parse(None, "/drain", DRAIN)
            .unwrap()
            .get("wait")
            .is_none());
    }

    #[test]
    fn refuses_unknown_duplicate_empty_and_malformed() {
        let err = Params::parse(Some("wiat=none"), "/drain", DRAIN).unwrap_err();
        assert!(
            err.contains("`wiat`") && err.contains("wait, timeout"),
            "{err}"
        );
        let err = Params::parse(Some("wait=none&wait=none"), "/drain", DRAIN).unwrap_err();
        assert!(err.contains("duplicate") && err.contains("`wait`"), "{err}");
        let err = Params::parse(Some("=none"), "/drain", DRAIN).unwrap_err();
        assert!(err.contains("empty parameter name"), "{err}");
        let err = Params::parse(Some("wait=%zz"), "/drain", DRAIN).unwrap_err();
        assert!(err.contains("`wait`"), "{err}");
        let err = Params::parse(Some("wait=%f"), "/drain", DRAIN).unwrap_err();
        assert!(err.contains("incomplete"), "{err}");
        let err = Params::parse(Some("wait=%ff"), "/drain", DRAIN).unwrap_err();
        assert!(err.contains("UTF-8"), "{err}");
        let err = Params::parse(Some("x"), "/status", &[]).unwrap_err();
        assert!(err.contains("takes no parameters"), "{err}");
    }

    #[test]
    fn flags() {
        let p = Params::parse(Some("verbose"), "/readyz", &["verbose"]).unwrap();
        assert_eq!(p.flag("verbose"), Ok(true));
        let p = Params::parse(Some("verbose=0"), "/readyz", &["verbose"]).unwrap();
        assert_eq!(p.flag("verbose"), Ok(false));
        let p = Params::parse(Some("verbose=yes"), "/readyz", &["verbose"]).unwrap();
        assert!(p.flag("verbose").unwrap_err().contains("`verbose`"));
    }

    #[test]
    fn shorten_keeps_messages_short() {
        let long = "x".repeat(500);
        assert_eq!(shorten(&long).chars().count(), 65);
        assert_eq!(shorten("a\r\nb"), "a??b");
    }

    #[test]
    fn wait_round_trips() {
        for w in [Wait::None, Wait::Propagated, Wait::Drained] {
            assert_eq!(w.as_str().parse::<Wait>().unwrap(), w);
        }
        let err = "Drained".parse::<Wait>().unwrap_err();
        assert!(err.is_parse());
    }
}
