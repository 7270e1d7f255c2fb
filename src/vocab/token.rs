//! What an admin bearer token may hold: one rule for the admin router, which compares it, the
//! `preStop` client, which sends it, and the coordinator's build, which refuses a token from
//! the environment that no request could carry (feature `admin`).
//!
//! The rule: surrounding whitespace is trimmed (a Secret made from a file often ends with a
//! newline); what is left is 1 to [`MAX_LEN`] bytes of visible ASCII, `!` to `~`. That is what
//! a header value carries verbatim through every client and proxy (kubelet's `httpGet`
//! `httpHeaders`, `curl -H`, the bundled client), and what `Authorization: Bearer <token>`
//! can hold without quoting: a space would split the credential, a tab or a line break would
//! be trimmed or refused on the way, a non-ASCII byte is not sent by most clients. Errors name
//! what is wrong and where, never the value.

use crate::vocab::error::ConfigError;

/// The environment variable the admin router reads its bearer token from by default, and
/// the `preStop` client its token.
///
/// Unset, empty or blank means no token. Surrounding whitespace is trimmed (a Secret created
/// from a file often ends with a newline). A value that breaks the token rule (visible ASCII,
/// `!` to `~`, at most 4096 bytes: no spaces, tabs, line breaks or non-ASCII characters)
/// makes [`DrainBuilder::build`](crate::DrainBuilder::build) fail.
pub const ADMIN_TOKEN_ENV: &str = "LAMEDUCK_ADMIN_TOKEN";

/// The longest token: a header line every client, proxy and HTTP/2 header list carries.
pub(crate) const MAX_LEN: usize = 4096;

/// The rule, for error messages.
pub(crate) const RULE: &str = "an admin token must be 1 to 4096 characters of visible ASCII \
     (`!` to `~`): no spaces, tabs, line breaks or non-ASCII characters, so that the admin \
     router and the preStop client agree on it (the value is not shown)";

/// `raw` without surrounding whitespace, if it meets the rule; else what is wrong with it
/// (`holds a space at character 7`), to follow the token's name in a message.
pub(crate) fn check(raw: &str) -> Result<&str, String> {
    let token = raw.trim();
    if token.is_empty() {
        return Err("is empty".to_owned());
    }
    if let Some((i, c)) = token.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
        let what = match c {
            ' ' => "a space",
            '\t' => "a tab",
            '\n' | '\r' => "a line break",
            c if c.is_control() => "a control character",
            _ => "a non-ASCII character",
        };
        let at = token[..i].chars().count() + 1;
        return Err(format!("holds {what} at character {at}"));
    }
    if token.len() > MAX_LEN {
        return Err(format!("is {} characters long", token.len()));
    }
    Ok(token)
}

/// Refuses an [`ADMIN_TOKEN_ENV`] that no request could carry: the admin router would refuse
/// every `/drain`, or the `preStop` client would fail every time.
pub(crate) fn check_env() -> Result<(), ConfigError> {
    let Some(raw) = std::env::var_os(ADMIN_TOKEN_ENV) else {
        return Ok(());
    };
    let problem = match raw.to_str() {
        None => "is not valid UTF-8".to_owned(),
        // Blank: no token.
        Some(t) if t.trim().is_empty() => return Ok(()),
        Some(t) => match check(t) {
            Ok(_) => return Ok(()),
            Err(p) => p,
        },
    };
    Err(ConfigError::env(format!(
        "{ADMIN_TOKEN_ENV} {problem}: {RULE}; fix the Secret or the variable, or unset it for no token"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_names_what_is_wrong_and_where_never_the_value() {
        assert_eq!(check("  s3cr3t-t0ken\n"), Ok("s3cr3t-t0ken"));
        assert_eq!(
            check("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
            Ok("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
        );
        let long = "x".repeat(MAX_LEN);
        assert_eq!(check(&long), Ok(long.as_str()));
        for (raw, why) in [
            ("", "is empty"),
            (" \n", "is empty"),
            ("ab cd", "holds a space at character 3"),
            ("ab\tcd", "holds a tab at character 3"),
            ("ab\r\nX-Evil: 1", "holds a line break at character 3"),
            ("ab\u{7f}", "holds a control character at character 3"),
            ("éab", "holds a non-ASCII character at character 1"),
            ("aé b", "holds a non-ASCII character at character 2"),
        ] {
            assert_eq!(check(raw), Err(why.to_owned()), "{raw:?}");
        }
        assert_eq!(
            check(&"x".repeat(MAX_LEN + 1)),
            Err(format!("is {} characters long", MAX_LEN + 1))
        );
    }
}
