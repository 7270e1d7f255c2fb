//! `correlate --svg`: the rollout as a picture, plain SVG with no script or stylesheet.
//!
//! One lane per instance (plus one for requests no instance answered), time left to right.
//! Each request is a mark at its start: a circle on a new connection, a square on a reused
//! one, filled by outcome (ok green, failed red, unfinished grey), one row per kind inside the
//! lane. Drain phases are bands (draining: drain started → stopped accepting; stopped: stopped
//! accepting → done or exit); signals, endpoint and proxy changes, the deadline and the exit
//! are vertical lines. Every element carries `data-*` attributes (`data-id`, `data-instance`,
//! `data-event`) so a script or a test can read the picture back.

use std::fmt::Write as _;

use crate::config::Kind;
use crate::correlate::{Correlation, ReportView};
use crate::record::{Outcome, Record};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 170.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const LANE: f64 = 66.0;
const LEGEND: f64 = 70.0;
/// More ticks than `nice_step` ever gives: the bound of the tick loop.
const MAX_TICKS: u32 = 32;
/// The lane of requests that no instance answered.
pub(crate) const NO_INSTANCE: &str = "(no answer)";

/// Markup-escaped, with control characters (which XML 1.0 forbids, or which show as nothing)
/// written out visibly as in the terminal table, and so are U+FFFE and U+FFFF: XML 1.0 forbids
/// them anywhere, even as character references, so only their name can stand in the SVG.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in crate::correlate::printable(s).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if xml_char(c) => out.push(c),
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
        }
    }
    out
}

/// A character XML 1.0 allows in a document (its production `Char`; a Rust `char` is never a
/// surrogate).
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='\u{FFFD}' | '\u{10000}'..)
}

fn outcome_colour(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "#2e7d32",
        Outcome::Failed => "#c62828",
        Outcome::Unfinished => "#9e9e9e",
    }
}

fn event_colour(event: &str) -> &'static str {
    let e = event.to_ascii_lowercase();
    if e.contains("exit") || e.contains("deadline") {
        "#000000"
    } else if e.contains("delet") {
        "#8d6e63"
    } else if e.contains("endpoint") {
        "#1565c0"
    } else if e.contains("proxy") {
        "#6a1b9a"
    } else if e.contains("sig") {
        "#ef6c00"
    } else {
        "#546e7a"
    }
}

/// Report events drawn as lines; the rest of the timeline is in the bands or the table.
fn drawn(event: &str) -> bool {
    matches!(
        event,
        "signal_received" | "stopped_accepting" | "deadline_exceeded" | "exit" | "done"
    )
}

/// The scale of one picture: time origin and span, and how many lanes it has.
struct Canvas {
    t0: f64,
    span: f64,
    lanes: usize,
}

impl Canvas {
    const PLOT: f64 = WIDTH - LEFT - RIGHT;

    fn x(&self, t: f64) -> f64 {
        LEFT + (t - self.t0) / self.span * Self::PLOT
    }

    /// Where the lanes end and the legend starts.
    fn lanes_bottom(&self) -> f64 {
        TOP + LANE * self.lanes as f64
    }

    fn height(&self) -> f64 {
        self.lanes_bottom() + LEGEND
    }
}

impl Correlation {
    /// The picture described in the module docs, as an SVG document.
    ///
    /// `records` are the records the correlation was made from.
    pub fn svg(&self, records: &[Record]) -> String {
        let lanes = self.lanes(records);
        let t0 = self.origin_unix_ms;
        // 2% room on the right so the last mark is not cut by the edge.
        let span = ((self.last_unix_ms(records) - t0) * 1.02).max(1.0);
        let canvas = Canvas {
            t0,
            span,
            lanes: lanes.len(),
        };
        let mut out = String::new();
        self.header(&mut out, &canvas, records);
        ticks(&mut out, &canvas);
        for (li, lane) in lanes.iter().enumerate() {
            self.lane(&mut out, &canvas, li, lane, records);
        }
        legend(&mut out, &canvas);
        out
    }

    /// One lane per instance, plus one for requests no instance answered if there are any.
    fn lanes(&self, records: &[Record]) -> Vec<String> {
        let mut lanes: Vec<String> = self.instances.iter().map(|i| i.instance.clone()).collect();
        if records.iter().any(|r| r.instance.is_none()) {
            lanes.push(NO_INSTANCE.to_owned());
        }
        lanes
    }

    /// When a record starts, in unix ms.
    fn start_unix_ms(&self, r: &Record) -> f64 {
        r.start_unix_ms.unwrap_or(self.origin_unix_ms + r.start_ms)
    }

    /// The latest time anything in the picture happens (never before the origin).
    fn last_unix_ms(&self, records: &[Record]) -> f64 {
        let ends = records
            .iter()
            .map(|r| self.start_unix_ms(r) + r.end_ms.unwrap_or(r.start_ms) - r.start_ms);
        let events = self.instances.iter().flat_map(|inst| {
            let reported = inst
                .report
                .iter()
                .flat_map(|r| &r.timeline)
                .map(|e| e.unix_ms);
            reported.chain(inst.external.iter().map(|e| e.unix_ms))
        });
        ends.chain(events).fold(self.origin_unix_ms, f64::max)
    }

    /// The document's opening, background, title and subtitle.
    fn header(&self, out: &mut String, canvas: &Canvas, records: &[Record]) {
        let (t0, span, height) = (canvas.t0, canvas.span, canvas.height());
        let _ = writeln!(
            out,
            r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12" data-origin-unix-ms="{t0}" data-span-ms="{span}">
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
        );
        let title = match &self.proxy_label {
            Some(p) => format!("rollout as the probe saw it, through {p}"),
            None => "rollout as the probe saw it".to_owned(),
        };
        let _ = writeln!(
            out,
            r##"<text x="10" y="20" font-size="15" font-weight="bold">{}</text>
        <text x="10" y="38" fill="#555">time →, {:.1} s from {} (unix ms); {} requests, {} failed</text>"##,
            esc(&title),
            span / 1000.0,
            t0 as u64,
            records.len(),
            records
                .iter()
                .filter(|r| r.outcome == Outcome::Failed)
                .count()
        );
    }

    /// One lane: its background and label, the instance's drain bands and event lines, and
    /// a mark per request it answered.
    fn lane(&self, out: &mut String, canvas: &Canvas, li: usize, lane: &str, records: &[Record]) {
        let y0 = TOP + LANE * li as f64;
        let _ = writeln!(out, r#"<g class="lane" data-instance="{}">"#, esc(lane));
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{y0}" width="{}" height="{LANE}" fill="{}" stroke="#cccccc"/><text x="10" y="{:.1}">{}</text>"##,
            Canvas::PLOT,
            if li % 2 == 0 { "#fafafa" } else { "#f2f2f2" },
            y0 + LANE / 2.0 + 4.0,
            esc(lane)
        );
        if let Some(inst) = self.instances.iter().find(|i| i.instance == lane) {
            if let Some(rep) = &inst.report {
                bands(out, canvas, rep, y0);
                for e in rep.timeline.iter().filter(|e| drawn(&e.event)) {
                    event_line(out, canvas, &e.event, lane, e.unix_ms, y0, false);
                }
            }
            for e in &inst.external {
                event_line(out, canvas, &e.event, lane, e.unix_ms, y0, true);
            }
        }
        for r in records
            .iter()
            .filter(|r| r.instance.as_deref().unwrap_or(NO_INSTANCE) == lane)
        {
            mark(out, r, canvas.x(self.start_unix_ms(r)), y0);
        }
        let _ = writeln!(out, "</g>");
    }
}

/// Second ticks along the top: at most about 12 (the inputs were checked to be plausible
/// times; the count is bounded whatever they are).
fn ticks(out: &mut String, canvas: &Canvas) {
    let step = nice_step(canvas.span);
    for tick in (0..=MAX_TICKS)
        .map(|k| k as f64 * step)
        .take_while(|t| t.is_finite() && *t <= canvas.span)
    {
        let tx = canvas.x(canvas.t0 + tick);
        let _ = writeln!(
            out,
            r##"<line class="tick" x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{:.1}" stroke="#eeeeee"/><text x="{tx:.1}" y="{:.1}" font-size="10" fill="#777" text-anchor="middle">{:.1}s</text>"##,
            canvas.lanes_bottom(),
            TOP - 2.0,
            tick / 1000.0
        );
    }
}

/// The drain phases of one instance as bands across its lane.
fn bands(out: &mut String, canvas: &Canvas, rep: &ReportView, y0: f64) {
    let at = |name: &str| {
        rep.timeline
            .iter()
            .find(|e| e.event == name)
            .map(|e| e.unix_ms)
    };
    let end = at("exit").or(at("done"));
    let bands = [
        (
            "draining",
            at("drain_started"),
            at("stopped_accepting").or(end),
            "#fff3c4",
        ),
        ("stopped", at("stopped_accepting"), end, "#ffd6cc"),
    ];
    for (name, from, to, fill) in bands {
        if let (Some(a), Some(b)) = (from, to) {
            let _ = writeln!(
                out,
                r#"<rect class="band {name}" data-from-ms="{:.0}" data-to-ms="{:.0}" x="{:.1}" y="{y0}" width="{:.1}" height="{LANE}" fill="{fill}" opacity="0.8"><title>{name}</title></rect>"#,
                a - canvas.t0,
                b - canvas.t0,
                canvas.x(a),
                (canvas.x(b) - canvas.x(a)).max(1.0)
            );
        }
    }
}

/// One request at `cx` in the lane starting at `y0`: a circle on a new connection, a square
/// on a reused one, in the row of its kind.
fn mark(out: &mut String, r: &Record, cx: f64, y0: f64) {
    let row = Kind::ALL.iter().position(|&k| k == r.kind).unwrap_or(0) as f64;
    let cy = y0 + 14.0 + row * 19.0;
    let conn = if r.reused { "reused" } else { "new" };
    let class = format!("mark {} {conn} {}", r.outcome.as_str(), r.kind.as_str());
    let tip = format!(
        "{} {} {} {conn} connection{}",
        r.id,
        r.kind,
        r.outcome,
        r.error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    let fill = outcome_colour(r.outcome);
    if r.reused {
        let _ = writeln!(
            out,
            r#"<rect class="{class}" data-id="{}" x="{:.1}" y="{:.1}" width="7" height="7" fill="{fill}"><title>{}</title></rect>"#,
            esc(&r.id),
            cx - 3.5,
            cy - 3.5,
            esc(&tip)
        );
    } else {
        let _ = writeln!(
            out,
            r#"<circle class="{class}" data-id="{}" cx="{cx:.1}" cy="{cy:.1}" r="4" fill="{fill}"><title>{}</title></circle>"#,
            esc(&r.id),
            esc(&tip)
        );
    }
}

/// The legend under the lanes, and the end of the document.
fn legend(out: &mut String, canvas: &Canvas) {
    let ly = canvas.lanes_bottom() + 22.0;
    let _ = writeln!(out, r#"<g class="legend">"#);
    mark_legend(out, ly);
    line_legend(out, ly + 22.0);
    let _ = writeln!(out, "</g>\n</svg>");
}

/// The first legend row: mark colours and shapes, and the bands.
fn mark_legend(out: &mut String, ly: f64) {
    let mut lx = 10.0;
    let items: [(&str, &str, &str); 7] = [
        ("circle", outcome_colour(Outcome::Ok), "ok"),
        ("circle", outcome_colour(Outcome::Failed), "failed"),
        ("circle", outcome_colour(Outcome::Unfinished), "unfinished"),
        ("circle", "#777777", "new connection"),
        ("square", "#777777", "reused connection"),
        ("band", "#fff3c4", "draining"),
        ("band", "#ffd6cc", "stopped accepting"),
    ];
    for (shape, fill, text) in items {
        let _ = match shape {
            "circle" => write!(
                out,
                r#"<circle cx="{:.1}" cy="{ly:.1}" r="4" fill="{fill}"/>"#,
                lx + 4.0
            ),
            "square" => write!(
                out,
                r#"<rect x="{lx:.1}" y="{:.1}" width="7" height="7" fill="{fill}"/>"#,
                ly - 3.5
            ),
            _ => write!(
                out,
                r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{fill}"/>"#,
                ly - 5.0
            ),
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{text}</text>"#,
            lx + 12.0,
            ly + 4.0
        );
        lx += 24.0 + 7.0 * text.len() as f64;
    }
}

/// The second legend row: event line colours, and what the rows in a lane are.
fn line_legend(out: &mut String, ly2: f64) {
    let mut lx2 = 10.0;
    for (name, sample) in [
        ("deletion", "deleted"),
        ("signal", "signal"),
        ("endpoint change", "endpoint"),
        ("proxy update", "proxy"),
        ("deadline / exit", "exit"),
        ("other event", "other"),
    ] {
        let _ = writeln!(
            out,
            r#"<line x1="{lx2:.1}" y1="{:.1}" x2="{lx2:.1}" y2="{:.1}" stroke="{}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            ly2 - 6.0,
            ly2 + 6.0,
            event_colour(sample),
            lx2 + 6.0,
            ly2 + 4.0
        );
        lx2 += 30.0 + 7.0 * name.len() as f64;
    }
    let _ = writeln!(
        out,
        r##"<text x="{lx2:.1}" y="{:.1}" fill="#555">rows in a lane: short, slow, stream</text>"##,
        ly2 + 4.0
    );
}

/// A vertical line for one event in the lane starting at `y0`; dashed when it came from the
/// events file rather than the instance's own report.
fn event_line(
    out: &mut String,
    canvas: &Canvas,
    event: &str,
    lane: &str,
    unix_ms: f64,
    y0: f64,
    external: bool,
) {
    let x = canvas.x(unix_ms);
    let at_ms = unix_ms - canvas.t0;
    let dash = if external {
        r#" stroke-dasharray="4 2""#
    } else {
        ""
    };
    let _ = writeln!(
        out,
        r#"<line class="event" data-event="{}" data-instance="{}" data-source="{}" data-at-ms="{:.0}" x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}><title>{} {} at {:.0} ms</title></line>"#,
        esc(event),
        esc(lane),
        if external { "events" } else { "report" },
        at_ms,
        y0 + LANE,
        event_colour(event),
        esc(lane),
        esc(event),
        at_ms
    );
}

/// A tick step of 1, 2 or 5 times a power of ten ms, giving at most about 12 ticks.
fn nice_step(span_ms: f64) -> f64 {
    let raw = span_ms / 12.0;
    let pow = 10f64.powf(raw.max(1.0).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * pow >= raw {
            return m * pow;
        }
    }
    10.0 * pow
}
