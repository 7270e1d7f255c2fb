//! What the service writes, kept bounded in bytes *after* the conversion to text.
//!
//! Invariants: a line is read at most [`MAX_LINE`] raw bytes at a time (the rest of a longer
//! line is read and dropped), and what is kept is measured after the lossy UTF-8 conversion,
//! which can triple a line (each invalid byte becomes U+FFFD, three bytes): the report line
//! at most [`MAX_LINE`] bytes, each of the last [`TAIL_LINES`] stderr lines at most
//! [`TAIL_LINE`]. So the store never holds more than `MAX_LINE + TAIL_LINES * TAIL_LINE`
//! bytes, whatever the service writes. stdout is read (a full pipe would stall the service)
//! and dropped: nothing is judged from it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Longest line read, and longest report line kept; a drain report is a few kilobytes.
const MAX_LINE: usize = 256 * 1024;
/// The stderr lines kept (the newest), for the check's report.
const TAIL_LINES: usize = 20;
/// Longest stderr line kept in the tail: enough for a panic message or a log line.
const TAIL_LINE: usize = 2 * 1024;
/// Ends a tail line that was cut.
const CUT: &str = " …";

/// What the service wrote to stderr, bounded.
#[derive(Debug, Default)]
pub(crate) struct Output {
    tail: VecDeque<String>,
    /// The last stderr line that looks like a lameduck drain report.
    report_line: Option<String>,
}

impl Output {
    /// The last stderr lines, oldest first.
    pub(crate) fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    /// The last stderr line that looks like a lameduck drain report.
    pub(crate) fn report_line(&self) -> Option<String> {
        self.report_line.clone()
    }

    fn keep(&mut self, raw: &[u8]) {
        // Only what can be kept is converted: a line of invalid bytes triples in the conversion.
        if raw.first() == Some(&b'{') && contains(raw, b"\"timeline\"") {
            let line = String::from_utf8_lossy(raw);
            self.report_line = Some(cut(line.trim_end(), MAX_LINE, ""));
        }
        let head = &raw[..raw.len().min(TAIL_LINE + 1)];
        let cut_raw = head.len() < raw.len();
        let line = String::from_utf8_lossy(head);
        let line = line.trim_end();
        let line = if cut_raw || line.len() > TAIL_LINE {
            cut(line, TAIL_LINE - CUT.len(), CUT)
        } else {
            line.to_owned()
        };
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }
}

/// `text` cut to at most `max` bytes on a character boundary, `mark` added when it was cut.
fn cut(text: &str, max: usize, mark: &str) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &text[..end])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Reads the service's lines, each cut at [`MAX_LINE`] bytes: a line is read a buffer at a
/// time and what passes the limit is dropped, so memory stays bounded whatever it writes.
/// With `output`, the lines are kept there; without, they are dropped.
pub(super) async fn keep_lines(stream: impl AsyncRead + Unpin, output: Option<Arc<Mutex<Output>>>) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let keep = |line: &[u8]| {
        if let Some(out) = &output {
            out.lock().expect("output lock").keep(line);
        }
    };
    loop {
        let chunk = match reader.fill_buf().await {
            Ok(chunk) if !chunk.is_empty() => chunk,
            _ => {
                if !line.is_empty() {
                    keep(&line);
                }
                return;
            }
        };
        let (used, ended) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if output.is_some() {
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&chunk[..used.min(room)]);
        }
        reader.consume(used);
        if ended {
            keep(&line);
            line.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_bytes_are_counted_after_the_conversion() {
        let mut out = Output::default();
        let mut report = b"{\"timeline\":[],\"x\":\"".to_vec();
        report.resize(MAX_LINE, 0xff);
        for _ in 0..3 * TAIL_LINES {
            out.keep(&vec![0xff; MAX_LINE]);
            out.keep(&report);
        }
        assert_eq!(out.tail.len(), TAIL_LINES);
        assert!(
            out.tail.iter().all(|l| l.len() <= TAIL_LINE),
            "{:?}",
            out.tail[0].len()
        );
        assert!(out.tail[0].ends_with(CUT));
        let line = out.report_line().unwrap();
        assert!(line.len() <= MAX_LINE && line.starts_with("{\"timeline\""));
    }

    #[test]
    fn short_lines_are_kept_whole() {
        let mut out = Output::default();
        out.keep("panicked at 'é'\n".as_bytes());
        assert_eq!(out.tail(), ["panicked at 'é'"]);
        assert_eq!(out.report_line(), None);
    }
}
