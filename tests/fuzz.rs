//! Bounded, seeded fuzzing of the duration parser, which takes outside input (env
//! `LAMEDUCK_GRACE_PERIOD`, the admin `timeout=` parameter, the example's flags), against a
//! reference written from its documented grammar. The admin router's own fuzz loop lives in
//! `tests/admin/fuzz.rs` (`random_requests_never_fail_the_server_nor_change_state`).
//!
//! `LAMEDUCK_FUZZ_SEED` and `LAMEDUCK_FUZZ_ITERS` change the seed and the count (default
//! 200,000 inputs, well under a second).

mod common;

use std::time::Duration;

use common::Rng;
use lameduck::parse_duration;

/// Pieces inputs are made of: digits most often, the units, whitespace, and what a careless
/// or hostile writer might put there.
const PIECES: &[&str] = &[
    "0",
    "1",
    "2",
    "5",
    "9",
    "30",
    "1500",
    "18446744073709551615",
    "18446744073709551616",
    "307445734561825860",
    "5124095576030431",
    "ms",
    "s",
    "m",
    "h",
    "",
    " ",
    "\t",
    "\n",
    "us",
    "µs",
    "ns",
    "d",
    "S",
    "MS",
    "sec",
    "-",
    "+",
    ".",
    "5.5",
    "e3",
    "٣",
    "１",
    "\u{a0}",
    "\u{2003}",
    "0x10",
    "_",
    "m s",
    "%",
    "\0",
];

/// The documented grammar: surrounding whitespace, a non-empty run of ASCII digits, optional
/// whitespace, an optional unit (`ms`, `s`, `m`, `h`; none means seconds). `None` where the
/// parser must refuse, with the value in nanoseconds otherwise.
fn reference(raw: &str) -> Option<u128> {
    let s = raw.trim();
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    let (digits, unit) = s.split_at(end);
    if digits.is_empty() {
        return None;
    }
    let n: u128 = digits.parse().ok()?;
    if n > u128::from(u64::MAX) {
        return None;
    }
    let secs_factor = match unit.trim() {
        "ms" => return Some(n * 1_000_000),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    let secs = n * secs_factor;
    (secs <= u128::from(u64::MAX)).then_some(secs * 1_000_000_000)
}

#[test]
fn parse_duration_agrees_with_its_grammar_on_random_input() {
    let seed = std::env::var("LAMEDUCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_00d0_u64);
    let iters = std::env::var("LAMEDUCK_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000_usize);
    let mut rng = Rng(seed | 1);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..iters {
        let mut raw = String::new();
        for _ in 0..rng.below(6) {
            raw.push_str(PIECES[rng.below(PIECES.len())]);
        }
        let got = parse_duration(&raw);
        match (reference(&raw), &got) {
            (Some(ns), Ok(d)) => {
                assert_eq!(d.as_nanos(), ns, "{raw:?} parsed to {d:?}");
                accepted += 1;
            }
            (None, Err(e)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("not a duration") && !msg.is_empty(),
                    "{raw:?}: unclear error {msg:?}"
                );
                refused += 1;
            }
            (want, got) => {
                panic!("{raw:?} (seed {seed}): the grammar says {want:?} ns, the parser {got:?}")
            }
        }
    }
    // Both sides of the grammar were exercised, not just one.
    assert!(
        accepted > iters / 50 && refused > iters / 50,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn the_edges_of_the_grammar() {
    assert_eq!(parse_duration(" 30 s ").unwrap(), Duration::from_secs(30));
    assert_eq!(
        parse_duration("307445734561825860m").unwrap(),
        Duration::from_secs(307_445_734_561_825_860 * 60)
    );
    // One more minute than fits: refused, not saturated.
    assert!(parse_duration("307445734561825861m").is_err());
    assert!(parse_duration("5124095576030432h").is_err());
    assert!(parse_duration("18446744073709551616").is_err());
    assert!(
        parse_duration("١٠s").is_err(),
        "non-ASCII digits are not digits here"
    );
}
