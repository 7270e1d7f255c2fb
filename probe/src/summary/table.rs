//! [`Summary::table`]: the summary as plain text, one part per function.

use std::fmt::Write as _;

use super::{Counts, FirstFailure, InstanceCounts, Summary};
use crate::latency::format_us;

/// How many instances the table lists by name; the rest are summed into one line.
const TABLE_INSTANCES: usize = 12;

/// One labelled line of the table.
fn row(out: &mut String, name: &str, value: String) {
    let _ = writeln!(out, "{name:<24}{value}");
}

impl Summary {
    /// The summary as a plain-text table, for a terminal or a test log.
    ///
    /// ```text
    /// lameduck-probe: 127.0.0.1:8080, HTTP/1.1, keepalive connections, label "default", 30.0 s
    ///
    ///               total  succeeded     failed unfinished
    ///   short         600        600          0          0
    ///   slow           60         60          0          0
    ///   all           660        660          0          0
    ///
    /// connections opened       23
    /// on new connections       23 requests
    /// on reused connections   637 requests
    /// served while draining    41 (reused connection 38, new connection 3)
    /// instances                web-1 330 (41 draining), web-2 330
    /// first failure            none
    /// ```
    pub fn table(&self) -> String {
        let mut out = String::new();
        self.heading(&mut out);
        self.counts_table(&mut out);
        self.connection_rows(&mut out);
        if !self.instances.is_empty() {
            row(&mut out, "instances", instances_text(&self.instances));
        }
        self.exception_rows(&mut out);
        self.latency_table(&mut out);
        let first = match &self.first_failure {
            None => "none".to_owned(),
            Some(f) => first_failure_text(f),
        };
        row(&mut out, "first failure", first);
        out
    }

    /// The first line (target, protocol, label, duration) and the proxy, if one was named.
    fn heading(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "lameduck-probe: {}, {}, {} connections, label {:?}, {:.1} s{}",
            self.target,
            self.http,
            self.connections,
            self.label,
            self.elapsed_ms / 1000.0,
            if self.stopped_early {
                " (stopped early)"
            } else {
                ""
            }
        );
        if let Some(proxy) = &self.proxy_label {
            let _ = writeln!(out, "through {proxy}");
        }
        let _ = writeln!(out);
    }

    /// Outcomes by kind (kinds not sent are left out) and in all.
    fn counts_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "  {:<8} {:>8} {:>10} {:>10} {:>10}",
            "", "total", "succeeded", "failed", "unfinished"
        );
        for (name, c) in [
            ("short", self.short),
            ("slow", self.slow),
            ("stream", self.stream),
            ("all", self.all),
        ] {
            if c.total == 0 && name != "all" {
                continue;
            }
            let _ = writeln!(
                out,
                "  {name:<8} {:>8} {:>10} {:>10} {:>10}",
                c.total, c.succeeded, c.failed, c.unfinished
            );
        }
        let _ = writeln!(out);
    }

    /// Connections opened, requests on new and reused ones, and answers while draining.
    fn connection_rows(&self, out: &mut String) {
        row(
            out,
            "connections opened",
            self.connections_opened.to_string(),
        );
        row(
            out,
            "on new connections",
            counts_text(self.on_new_connection),
        );
        row(
            out,
            "on reused connections",
            counts_text(self.on_reused_connection),
        );
        row(
            out,
            "served while draining",
            format!(
                "{} (reused connection {}, new connection {})",
                self.draining_reused + self.draining_new,
                self.draining_reused,
                self.draining_new
            ),
        );
    }

    /// The rows shown only when something unusual happened: reroutes, requests not sent,
    /// failures by group, retries.
    fn exception_rows(&self, out: &mut String) {
        if self.rerouted > 0 {
            row(
                out,
                "rerouted before sending",
                format!(
                    "{} (connection closed or going away before the request was sent)",
                    self.rerouted
                ),
            );
        }
        if self.not_sent > 0 {
            row(
                out,
                "not sent",
                format!("{} (max in-flight reached)", self.not_sent),
            );
        }
        for (i, (key, n)) in self.failures.iter().enumerate() {
            let name = if i == 0 { "failures" } else { "" };
            row(out, name, format!("{n:>6}  {key}"));
        }
        if self.retried > 0 {
            row(
                out,
                "retried once",
                format!(
                    "{} failed, then succeeded on retry; {} failed again (all {} counted failed above)",
                    self.retry_succeeded, self.retry_failed, self.retried
                ),
            );
        }
    }

    fn latency_table(&self, out: &mut String) {
        if self.latency.is_empty() {
            return;
        }
        let note = match self.drain_span_ms {
            Some([a, b]) => format!(
                "draining answers from {:.3} s to {:.3} s",
                a / 1000.0,
                b / 1000.0
            ),
            None => "no answer said draining: all before".to_owned(),
        };
        let _ = writeln!(out);
        let _ = writeln!(out, "latency of ok requests ({note})");
        let _ = writeln!(
            out,
            "  {:<8} {:<8} {:>8} {:>10} {:>10} {:>10}",
            "", "window", "count", "p50", "p99", "max"
        );
        for r in &self.latency {
            let _ = writeln!(
                out,
                "  {:<8} {:<8} {:>8} {:>10} {:>10} {:>10}",
                r.kind.as_str(),
                r.window.as_str(),
                r.count,
                format_us(r.p50_us),
                format_us(r.p99_us),
                format_us(r.max_us)
            );
        }
        let _ = writeln!(out);
    }
}

/// The first [`TABLE_INSTANCES`] instances by name with their counts, the rest summed.
fn instances_text(instances: &[InstanceCounts]) -> String {
    let mut parts: Vec<String> = instances
        .iter()
        .take(TABLE_INSTANCES)
        .map(instance_text)
        .collect();
    if instances.len() > TABLE_INSTANCES {
        let rest: u64 = instances[TABLE_INSTANCES..]
            .iter()
            .map(|i| i.requests)
            .sum();
        parts.push(format!(
            "{} more with {rest}",
            instances.len() - TABLE_INSTANCES
        ));
    }
    parts.join(", ")
}

/// `web-1 330 (41 draining, 2 failed)`, the notes only when not zero.
fn instance_text(i: &InstanceCounts) -> String {
    let mut s = format!("{} {}", i.instance, i.requests);
    if i.draining > 0 || i.failed > 0 {
        let mut notes = Vec::new();
        if i.draining > 0 {
            notes.push(format!("{} draining", i.draining));
        }
        if i.failed > 0 {
            notes.push(format!("{} failed", i.failed));
        }
        let _ = write!(s, " ({})", notes.join(", "));
    }
    s
}

fn first_failure_text(f: &FirstFailure) -> String {
    let conn = match f.conn {
        Some(id) => format!(
            "{} connection #{id}",
            if f.reused { "reused" } else { "new" }
        ),
        None => "no connection".to_owned(),
    };
    let instance = f
        .instance
        .as_deref()
        .map(|i| format!(", instance {i}"))
        .unwrap_or_default();
    format!(
        "at {:.3} s, request {} ({}, {conn}{instance}): {}",
        f.at_ms / 1000.0,
        f.id,
        f.kind,
        f.error
    )
}

fn counts_text(c: Counts) -> String {
    let mut s = format!("{} requests", c.total);
    if c.failed > 0 || c.unfinished > 0 {
        let _ = write!(s, " ({} failed, {} unfinished)", c.failed, c.unfinished);
    }
    s
}
