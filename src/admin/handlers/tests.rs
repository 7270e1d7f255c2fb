use super::admission::{bearer, constant_time_eq};
use super::*;

#[test]
fn bearer_parsing() {
    assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
    assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
    assert_eq!(bearer(b"Basic abc"), None);
    assert_eq!(bearer(b"Bearer"), None);
    assert_eq!(bearer(b"Bearer "), None);
}

#[test]
fn constant_time_eq_compares() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
}

#[test]
fn token_settings_fail_closed() {
    assert!(matches!(Token::from_setting(" t\n", "x"), Token::Required(t) if &*t == b"t"));
    assert!(matches!(Token::from_setting("  ", "x"), Token::Invalid(_)));
    assert!(matches!(
        Token::from_setting("a\u{7}b", "x"),
        Token::Invalid(_)
    ));
}
