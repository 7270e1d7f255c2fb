//! How bounded pieces of user code ended, as the report records them: resource closers,
//! background tasks and their recovery actions. The parts that run them (`closers`, `tasks`,
//! `action`) produce these values; the report only holds them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a resource closer or a recovery action ended, as the report records it
/// ([`CloserResult::result`](crate::report::CloserResult::result),
/// [`Straggler::recovery`](crate::report::Straggler::recovery)).
///
/// In JSON a string: `ok`, `error: <message>`, `panicked`, `aborted`, `timed_out` or
/// `skipped`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ActionResult {
    /// Returned `Ok`.
    Ok,
    /// Returned an error, with its message.
    Error(String),
    /// Panicked.
    Panicked,
    /// Was cancelled before it finished.
    Aborted,
    /// Did not finish within its time and was cut.
    TimedOut,
    /// Did not run: no time was left before the hard deadline, or the exit was forced before
    /// its turn (closers only).
    Skipped,
}

/// The prefix of an error's JSON form, `error: <message>`.
const ERROR_PREFIX: &str = "error: ";

impl ActionResult {
    /// The one table of the names without a message.
    const NAMED: [(ActionResult, &'static str); 5] = [
        (ActionResult::Ok, "ok"),
        (ActionResult::Panicked, "panicked"),
        (ActionResult::Aborted, "aborted"),
        (ActionResult::TimedOut, "timed_out"),
        (ActionResult::Skipped, "skipped"),
    ];

    /// `true` for [`ActionResult::Ok`].
    pub fn is_ok(&self) -> bool {
        *self == ActionResult::Ok
    }

    fn name(&self) -> Option<&'static str> {
        Self::NAMED
            .iter()
            .find(|(r, _)| r == self)
            .map(|(_, name)| *name)
    }

    fn parse(s: &str) -> Option<Self> {
        if let Some(message) = s.strip_prefix(ERROR_PREFIX) {
            return Some(ActionResult::Error(message.to_owned()));
        }
        Self::NAMED
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(r, _)| r.clone())
    }
}

impl fmt::Display for ActionResult {
    /// The JSON form: `ok`, `error: <message>`, ….
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.name()) {
            (ActionResult::Error(message), _) => write!(f, "{ERROR_PREFIX}{message}"),
            (_, Some(name)) => f.write_str(name),
            (_, None) => unreachable!("every variant without a message is in NAMED"),
        }
    }
}

impl Serialize for ActionResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ActionResult {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`{s}` is not an action result: expected ok, error: <message>, panicked, aborted, timed_out or skipped"
            ))
        })
    }
}

/// How a background task ended abnormally: [`TaskEnd::result`].
///
/// In JSON: `panicked`, `aborted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskResult {
    /// The task panicked.
    Panicked,
    /// The task was aborted at the quiesce deadline (or when the drain was forced).
    Aborted,
}

impl TaskResult {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

impl std::fmt::Display for TaskResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A background task that did not end normally, as recorded in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskEnd {
    /// The task's name.
    pub name: String,
    /// `panicked` or `aborted`.
    pub result: TaskResult,
    /// How long it ran, in milliseconds.
    pub ran_ms: u64,
}

/// How one closer went, as recorded in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CloserResult {
    /// The name given to [`Work::on_close`](crate::Work::on_close).
    pub name: String,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
    /// `ok`, `error: <message>`, `panicked`, `aborted` (cut by a forced exit), `timed_out` or
    /// `skipped` (no budget left, or the exit was forced before its turn).
    pub result: ActionResult,
}

impl CloserResult {
    /// `true` if the closer returned `Ok`.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::ActionResult;

    #[test]
    fn the_json_form_round_trips() {
        let all = [
            ActionResult::Ok,
            ActionResult::Error("connection reset".to_owned()),
            ActionResult::Panicked,
            ActionResult::Aborted,
            ActionResult::TimedOut,
            ActionResult::Skipped,
        ];
        for r in all {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{r}\""));
            assert_eq!(serde_json::from_str::<ActionResult>(&json).unwrap(), r);
        }
        assert_eq!(
            ActionResult::Error("boom".to_owned()).to_string(),
            "error: boom"
        );
        assert!(serde_json::from_str::<ActionResult>("\"exploded\"").is_err());
    }
}
