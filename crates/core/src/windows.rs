//! Maintenance windows: when evictions are allowed.
//!
//! A policy lists windows in `spec.windows`. Each window has a cron `schedule`, a
//! `duration` and an optional IANA `timeZone` (default `UTC`). A window *opens* at every
//! instant its schedule fires, read on the wall clock of its time zone, and stays open for
//! `duration` of elapsed (real) time. A window is the half-open interval `[start, end)`:
//! it is open at `start` and closed from `end` on. With several windows, evictions are
//! allowed while any of them is open (the union).
//!
//! # Schedule syntax
//!
//! Exactly five whitespace-separated fields: `minute hour day-of-month month day-of-week`
//! (for example `0 2 * * *` is 02:00 every day, `30 22 * * MON-FRI` is 22:30 on weekdays).
//! Names (`JAN`-`DEC`, `SUN`-`SAT`), lists, ranges and steps are accepted, as are the
//! extensions `L` (last), `W` (nearest weekday) and `#` (nth weekday, e.g. `SUN#1`).
//! Day 0 and 7 are both Sunday. When both day-of-month and day-of-week are restricted the
//! schedule fires when *either* matches (classic Vixie cron rule): `0 0 1 * MON` fires on
//! the 1st of the month and on every Monday.
//!
//! Refused: a seconds or a year field (six or seven fields), `@` macros such as `@daily`
//! (write `0 0 * * *`), and schedules that never fire (for example `0 0 31 2 *`, "February
//! 31st"). The check looks for an occurrence from 2000 to 2099, which holds every
//! combination of month, day, weekday and leap year; a schedule that matches none of them
//! never fires. Rare but valid schedules pass (`0 0 29 2 *`, `0 0 * 2 MON#5`).
//!
//! # Time zones and daylight saving time
//!
//! The rule: **a scheduled wall-clock time `T` opens the window at the first instant at
//! which the clock of the time zone shows `T` or later.** In everyday terms:
//!
//! * **Ordinary times** open at the one instant the clock shows `T`.
//! * **Spring forward (gap).** A time that does not exist that day, such as 02:30 on the
//!   night clocks jump from 02:00 to 03:00 (America/New_York, Europe/Berlin), opens the
//!   window at the first instant after the gap: 03:00 local, the new offset. The window
//!   is not skipped for that day. It still lasts its full `duration` from 03:00.
//!   Several scheduled times in the same gap (e.g. `*/15 2 * * *`) all open at that same
//!   instant, so they give a single window there.
//! * **Fall back (overlap).** A time that occurs twice, such as 01:30 on the night clocks
//!   go back from 02:00 to 01:00 in America/New_York, opens the window **once**, at its
//!   first occurrence (the earlier instant, still on summer time). It does not open again
//!   when the clock shows 01:30 a second time. This also holds for schedules that fire
//!   often: `0 * * * *` opens at 01:00 summer time, not again at 01:00 winter time.
//! * **Duration is elapsed time**, computed in UTC, not a wall-clock difference. A `3h`
//!   window opening at 01:00 on a fall-back night in America/New_York (01:00 EDT,
//!   05:00 UTC) closes at 08:00 UTC, which the clock shows as 03:00 EST; on a
//!   spring-forward night, a `3h` window from 01:00 EST (06:00 UTC) closes at 09:00 UTC,
//!   05:00 EDT.
//! * Day-of-week and day-of-month are those of the local date in the window's zone.
//!
//! # Overlaps and long windows
//!
//! A window may be longer than its schedule's period (e.g. `0 * * * *` for `3h`), and
//! windows of a policy may overlap; the union is open. When several windows are open at
//! once, [`Windows::open_at`] reports the one that ends last.
//!
//! Times are reported as RFC 3339 strings with the UTC offset of the window's own zone,
//! e.g. `2026-12-03T02:00:00+08:00` (see [`Windows::status`]).

use std::fmt;

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, SecondsFormat, TimeDelta, TimeZone,
    Utc,
};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use gpu_defrag_api::v1alpha1::{Window, WindowTimes};

/// Upper bound on cron occurrences skipped in a single search (occurrences whose opening
/// instant falls on the wrong side of `now` because of a clock change). Even a
/// per-minute schedule inside a day-long overlap stays far below it.
const MAX_SKIPPED_OCCURRENCES: usize = 10_000;

/// Longest clock gap searched past, in minutes (the longest real one is a skipped day).
const MAX_GAP_MINUTES: usize = 48 * 60;

/// An invalid entry of `spec.windows`. The message names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// The cron schedule does not parse, has the wrong number of fields, or never fires.
    #[error("spec.windows[{index}].schedule {schedule:?}: {message}")]
    BadSchedule {
        /// Position in `spec.windows`.
        index: usize,
        /// The schedule as written.
        schedule: String,
        /// What is wrong with it.
        message: String,
    },
    /// The time zone is not a known IANA zone name.
    #[error(
        "spec.windows[{index}].timeZone {zone:?} is not a known IANA time zone (e.g. UTC, Europe/Berlin, Asia/Shanghai)"
    )]
    BadTimeZone {
        /// Position in `spec.windows`.
        index: usize,
        /// The zone as written.
        zone: String,
    },
    /// The duration does not parse.
    #[error("spec.windows[{index}].duration: {message}")]
    BadDuration {
        /// Position in `spec.windows`.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The duration is zero: the window would never be open.
    #[error("spec.windows[{index}].duration must be greater than zero (e.g. 3h or 90m)")]
    ZeroDuration {
        /// Position in `spec.windows`.
        index: usize,
    },
}

/// One opening of a window: the half-open interval `[start, end)`, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// First instant the window is open.
    pub start: DateTime<Utc>,
    /// First instant the window is closed again.
    pub end: DateTime<Utc>,
}

impl Span {
    /// Whether `t` lies in `[start, end)`.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && t < self.end
    }

    /// `start` as RFC 3339 with the UTC offset `tz` has at that instant,
    /// e.g. `2026-12-03T02:00:00+08:00`.
    pub fn start_local(&self, tz: Tz) -> String {
        format_in(self.start, tz)
    }

    /// `end` as RFC 3339 with the UTC offset `tz` has at that instant.
    pub fn end_local(&self, tz: Tz) -> String {
        format_in(self.end, tz)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}, {})",
            format_in(self.start, Tz::UTC),
            format_in(self.end, Tz::UTC)
        )
    }
}

/// RFC 3339 in `tz`'s offset, fractional seconds only when present, never `Z`.
fn format_in(t: DateTime<Utc>, tz: Tz) -> String {
    t.with_timezone(&tz)
        .to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

/// One parsed entry of `spec.windows`.
#[derive(Debug, Clone)]
pub struct MaintenanceWindow {
    index: usize,
    cron: Cron,
    tz: Tz,
    duration: TimeDelta,
    schedule: String,
    duration_text: String,
}

impl MaintenanceWindow {
    /// Parses `spec.windows[index]`. Errors name that field.
    pub fn parse(index: usize, w: &Window) -> Result<Self, WindowError> {
        let cron = parse_schedule(&w.schedule).map_err(|message| WindowError::BadSchedule {
            index,
            schedule: w.schedule.clone(),
            message,
        })?;
        let tz = match w.time_zone.as_deref() {
            None => Tz::UTC,
            Some(zone) => zone
                .trim()
                .parse::<Tz>()
                .map_err(|_| WindowError::BadTimeZone {
                    index,
                    zone: zone.to_string(),
                })?,
        };
        let std_duration = crate::policy::parse_duration(&w.duration)
            .map_err(|message| WindowError::BadDuration { index, message })?;
        if std_duration.is_zero() {
            return Err(WindowError::ZeroDuration { index });
        }
        let duration = TimeDelta::from_std(std_duration).map_err(|_| WindowError::BadDuration {
            index,
            message: format!("{:?} is too long", w.duration),
        })?;
        Ok(MaintenanceWindow {
            index,
            cron,
            tz,
            duration,
            schedule: w.schedule.clone(),
            duration_text: w.duration.clone(),
        })
    }

    /// Position in `spec.windows`.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The schedule as written.
    pub fn schedule(&self) -> &str {
        &self.schedule
    }

    /// The duration as written.
    pub fn duration_text(&self) -> &str {
        &self.duration_text
    }

    /// How long each opening lasts (elapsed time).
    pub fn duration(&self) -> TimeDelta {
        self.duration
    }

    /// The time zone the schedule is read in.
    pub fn time_zone(&self) -> Tz {
        self.tz
    }

    /// The opening of this window that contains `now`, if any. When openings overlap
    /// (duration longer than the schedule's period) this is the latest one, which ends last.
    pub fn open_at(&self, now: DateTime<Utc>) -> Option<Span> {
        let start = self.last_start_at_or_before(now)?;
        let span = self.span_from(start)?;
        span.contains(now).then_some(span)
    }

    /// The first opening that starts strictly after `now`.
    pub fn next_after(&self, now: DateTime<Utc>) -> Option<Span> {
        let mut cursor = now.with_timezone(&self.tz).naive_local();
        // Every scheduled wall-clock time up to the clock reading at `now` has opened at
        // or before `now` (its first instant is no later than `now`'s own), so start
        // strictly after it and skip the few that opened earlier in a repeated hour.
        for _ in 0..MAX_SKIPPED_OCCURRENCES {
            let n = self.cron.find_next_occurrence(&cursor, false).ok()?;
            let t = first_instant_at_or_after(self.tz, n)?;
            if t > now {
                return self.span_from(t);
            }
            cursor = n;
        }
        None
    }

    fn span_from(&self, start: DateTime<Utc>) -> Option<Span> {
        Some(Span {
            start,
            end: start.checked_add_signed(self.duration)?,
        })
    }

    /// The latest opening instant at or before `now`.
    fn last_start_at_or_before(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let reading = now.with_timezone(&self.tz).naive_local();
        // If the clock reading at `now` is one it shows twice (fall back), scheduled times
        // up to the end of the repeated range opened on its first pass, possibly before
        // `now`: search back from there. Otherwise no later time can have opened yet.
        let mut cursor = match self.tz.from_local_datetime(&reading) {
            LocalResult::Ambiguous(a, b) => {
                let repeated = (b.with_timezone(&Utc) - a.with_timezone(&Utc)).abs();
                reading.checked_add_signed(repeated)?
            }
            _ => reading,
        };
        let mut inclusive = true;
        for _ in 0..MAX_SKIPPED_OCCURRENCES {
            let n = self
                .cron
                .find_previous_occurrence(&cursor, inclusive)
                .ok()?;
            let t = first_instant_at_or_after(self.tz, n)?;
            if t <= now {
                return Some(t);
            }
            cursor = n;
            inclusive = false;
        }
        None
    }
}

/// Parses a five-field cron schedule; the error is a human message.
fn parse_schedule(schedule: &str) -> Result<Cron, String> {
    let s = schedule.trim();
    if s.is_empty() {
        return Err("empty schedule; expected 5 cron fields: minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\"".into());
    }
    if s.contains('@') {
        return Err(
            "@ macros are not supported; write the 5 cron fields, e.g. \"0 0 * * *\" for @daily"
                .into(),
        );
    }
    let fields = s.split_whitespace().count();
    if fields != 5 {
        return Err(format!(
            "has {fields} field{}; expected exactly 5: minute hour day-of-month month day-of-week (no seconds or year field)",
            if fields == 1 { "" } else { "s" }
        ));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
        .parse(s)
        .map_err(|e| format!("not a valid cron expression: {e}"))?;
    // The Gregorian calendar repeats every 28 years between 1901 and 2099, so a schedule
    // that does not fire from 2000 to 2099 never fires at all (e.g. "0 0 31 2 *").
    let probe = NaiveDate::from_ymd_opt(2000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("valid probe date");
    match cron.find_next_occurrence(&probe, true) {
        Ok(n) if n.year() < 2100 => Ok(cron),
        _ => Err("never fires (no date matches, e.g. February 31st)".into()),
    }
}

/// The first instant at which `tz`'s clock shows `wall` or later: the instant itself for
/// an ordinary time, the earlier one for a time shown twice, the end of the gap for a
/// time skipped by a forward jump.
fn first_instant_at_or_after(tz: Tz, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.with_timezone(&Utc)),
        LocalResult::None => {
            // Walk minutes to the first shown time past the gap, then back off second by
            // second in case the gap ended off a whole minute (historic offsets).
            let mut m = wall;
            for _ in 0..MAX_GAP_MINUTES {
                m = m.checked_add_signed(TimeDelta::minutes(1))?;
                let found = match tz.from_local_datetime(&m) {
                    LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t.with_timezone(&Utc),
                    LocalResult::None => continue,
                };
                let mut t = found;
                for _ in 0..60 {
                    let before = t - TimeDelta::seconds(1);
                    if before.with_timezone(&tz).naive_local() >= wall {
                        t = before;
                    } else {
                        break;
                    }
                }
                return Some(t);
            }
            None
        }
    }
}

/// The parsed `spec.windows` of a policy.
#[derive(Debug, Clone, Default)]
pub struct Windows(Vec<MaintenanceWindow>);

impl Windows {
    /// Parses every window; the first invalid one (lowest index) is reported.
    pub fn parse(ws: &[Window]) -> Result<Windows, WindowError> {
        ws.iter()
            .enumerate()
            .map(|(i, w)| MaintenanceWindow::parse(i, w))
            .collect::<Result<Vec<_>, _>>()
            .map(Windows)
    }

    /// No windows at all (evictions are never allowed).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The parsed windows, in `spec.windows` order.
    pub fn iter(&self) -> impl Iterator<Item = &MaintenanceWindow> {
        self.0.iter()
    }

    /// The window open at `now`, if any, as `[start, end)` in UTC. If several are open,
    /// the one ending last (on a tie, the lowest index).
    pub fn open_at(&self, now: DateTime<Utc>) -> Option<Span> {
        self.open_at_with_window(now).map(|(_, s)| s)
    }

    /// The window open at `now` if there is one, else the next one to open strictly
    /// after `now` (earliest start; on a tie, the one ending last).
    pub fn next(&self, now: DateTime<Utc>) -> Option<Span> {
        self.next_with_window(now).map(|(_, s)| s)
    }

    /// [`Windows::next`] formatted for `status.nextWindow`: start and end as RFC 3339 in
    /// the offset of the zone of the window they belong to, and whether it is open now.
    pub fn status(&self, now: DateTime<Utc>) -> Option<WindowTimes> {
        let (w, span) = self.next_with_window(now)?;
        Some(WindowTimes {
            start: span.start_local(w.tz),
            end: span.end_local(w.tz),
            open: span.contains(now),
        })
    }

    /// Like [`Windows::open_at`], with the window the span belongs to.
    pub fn open_at_with_window(&self, now: DateTime<Utc>) -> Option<(&MaintenanceWindow, Span)> {
        let mut best: Option<(&MaintenanceWindow, Span)> = None;
        for w in &self.0 {
            if let Some(s) = w.open_at(now)
                && best.is_none_or(|(_, b)| s.end > b.end)
            {
                best = Some((w, s));
            }
        }
        best
    }

    /// Like [`Windows::next`], with the window the span belongs to.
    pub fn next_with_window(&self, now: DateTime<Utc>) -> Option<(&MaintenanceWindow, Span)> {
        if let Some(open) = self.open_at_with_window(now) {
            return Some(open);
        }
        let mut best: Option<(&MaintenanceWindow, Span)> = None;
        for w in &self.0 {
            if let Some(s) = w.next_after(now)
                && best
                    .is_none_or(|(_, b)| s.start < b.start || (s.start == b.start && s.end > b.end))
            {
                best = Some((w, s));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn win(schedule: &str, duration: &str, zone: Option<&str>) -> Window {
        Window {
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: zone.map(Into::into),
        }
    }

    fn ws(list: &[(&str, &str, Option<&str>)]) -> Windows {
        let v: Vec<Window> = list.iter().map(|(s, d, z)| win(s, d, *z)).collect();
        Windows::parse(&v).expect("valid windows")
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("rfc3339")
            .with_timezone(&Utc)
    }

    fn span(start: &str, end: &str) -> Span {
        Span {
            start: utc(start),
            end: utc(end),
        }
    }

    /// (description, windows, now, expected open_at, expected next)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str, Option<&'static str>)],
        &'static str,
        Option<(&'static str, &'static str)>,
        Option<(&'static str, &'static str)>,
    );

    const NY: Option<&str> = Some("America/New_York");
    const BER: Option<&str> = Some("Europe/Berlin");

    const CASES: &[Case] = &[
        // Daily UTC, 02:00 for 3h.
        (
            "utc before",
            &[("0 2 * * *", "3h", None)],
            "2026-03-10T01:59:59Z",
            None,
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
        ),
        (
            "utc at start",
            &[("0 2 * * *", "3h", None)],
            "2026-03-10T02:00:00Z",
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
        ),
        (
            "utc end - 1s",
            &[("0 2 * * *", "3h", None)],
            "2026-03-10T04:59:59Z",
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
        ),
        (
            "utc at end is closed",
            &[("0 2 * * *", "3h", None)],
            "2026-03-10T05:00:00Z",
            None,
            Some(("2026-03-11T02:00:00Z", "2026-03-11T05:00:00Z")),
        ),
        (
            "explicit UTC zone",
            &[("0 2 * * *", "3h", Some("UTC"))],
            "2026-03-10T03:00:00Z",
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
            Some(("2026-03-10T02:00:00Z", "2026-03-10T05:00:00Z")),
        ),
        (
            "sub-second end",
            &[("0 2 * * *", "500ms", None)],
            "2026-03-10T02:00:00.499Z",
            Some(("2026-03-10T02:00:00Z", "2026-03-10T02:00:00.500Z")),
            Some(("2026-03-10T02:00:00Z", "2026-03-10T02:00:00.500Z")),
        ),
        (
            "sub-second end closed",
            &[("0 2 * * *", "500ms", None)],
            "2026-03-10T02:00:00.500Z",
            None,
            Some(("2026-03-11T02:00:00Z", "2026-03-11T02:00:00.500Z")),
        ),
        // Asia/Shanghai, +08:00, no DST.
        (
            "shanghai",
            &[("0 2 * * *", "3h", Some("Asia/Shanghai"))],
            "2026-12-02T12:00:00Z",
            None,
            Some(("2026-12-03T02:00:00+08:00", "2026-12-03T05:00:00+08:00")),
        ),
        (
            "shanghai open",
            &[("0 2 * * *", "3h", Some("Asia/Shanghai"))],
            "2026-12-02T18:30:00Z",
            Some(("2026-12-02T18:00:00Z", "2026-12-02T21:00:00Z")),
            Some(("2026-12-02T18:00:00Z", "2026-12-02T21:00:00Z")),
        ),
        // Weekdays, 22:00 for 8h; 2026-03-13 is a Friday.
        (
            "weekday friday night",
            &[("0 22 * * MON-FRI", "8h", None)],
            "2026-03-14T05:00:00Z",
            Some(("2026-03-13T22:00:00Z", "2026-03-14T06:00:00Z")),
            Some(("2026-03-13T22:00:00Z", "2026-03-14T06:00:00Z")),
        ),
        (
            "weekday saturday night closed",
            &[("0 22 * * MON-FRI", "8h", None)],
            "2026-03-14T23:00:00Z",
            None,
            Some(("2026-03-16T22:00:00Z", "2026-03-17T06:00:00Z")),
        ),
        (
            "numeric dow 1-5",
            &[("0 22 * * 1-5", "8h", None)],
            "2026-03-15T12:00:00Z",
            None,
            Some(("2026-03-16T22:00:00Z", "2026-03-17T06:00:00Z")),
        ),
        (
            "dom or dow (vixie)",
            &[("0 0 1 * MON", "1h", None)],
            "2026-03-01T12:00:00Z",
            None,
            Some(("2026-03-02T00:00:00Z", "2026-03-02T01:00:00Z")),
        ),
        (
            "feb 29",
            &[("0 0 29 2 *", "1h", None)],
            "2026-03-01T00:00:00Z",
            None,
            Some(("2028-02-29T00:00:00Z", "2028-02-29T01:00:00Z")),
        ),
        (
            "first sunday",
            &[("0 2 * * SUN#1", "2h", None)],
            "2026-03-02T00:00:00Z",
            None,
            Some(("2026-04-05T02:00:00Z", "2026-04-05T04:00:00Z")),
        ),
        // Overlapping windows: the open one ending last.
        (
            "overlap first only",
            &[("0 1 * * *", "4h", None), ("0 3 * * *", "4h", None)],
            "2026-03-10T02:00:00Z",
            Some(("2026-03-10T01:00:00Z", "2026-03-10T05:00:00Z")),
            Some(("2026-03-10T01:00:00Z", "2026-03-10T05:00:00Z")),
        ),
        (
            "overlap both",
            &[("0 1 * * *", "4h", None), ("0 3 * * *", "4h", None)],
            "2026-03-10T04:00:00Z",
            Some(("2026-03-10T03:00:00Z", "2026-03-10T07:00:00Z")),
            Some(("2026-03-10T03:00:00Z", "2026-03-10T07:00:00Z")),
        ),
        (
            "overlap next earliest",
            &[("0 3 * * *", "4h", None), ("0 1 * * *", "1h", None)],
            "2026-03-10T00:00:00Z",
            None,
            Some(("2026-03-10T01:00:00Z", "2026-03-10T02:00:00Z")),
        ),
        // Duration longer than the period.
        (
            "hourly 3h",
            &[("0 * * * *", "3h", None)],
            "2026-03-10T10:30:00Z",
            Some(("2026-03-10T10:00:00Z", "2026-03-10T13:00:00Z")),
            Some(("2026-03-10T10:00:00Z", "2026-03-10T13:00:00Z")),
        ),
        (
            "weekly 30h",
            &[("0 0 * * MON", "30h", None)],
            "2026-03-10T05:59:59Z",
            Some(("2026-03-09T00:00:00Z", "2026-03-10T06:00:00Z")),
            Some(("2026-03-09T00:00:00Z", "2026-03-10T06:00:00Z")),
        ),
        (
            "weekly 30h end",
            &[("0 0 * * MON", "30h", None)],
            "2026-03-10T06:00:00Z",
            None,
            Some(("2026-03-16T00:00:00Z", "2026-03-17T06:00:00Z")),
        ),
        // Spring forward, America/New_York 2026-03-08: 02:00 EST -> 03:00 EDT (07:00Z).
        (
            "ny gap opens at 03:00 EDT",
            &[("30 2 * * *", "1h", NY)],
            "2026-03-08T00:00:00Z",
            None,
            Some(("2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z")),
        ),
        (
            "ny gap open",
            &[("30 2 * * *", "1h", NY)],
            "2026-03-08T07:59:59Z",
            Some(("2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z")),
            Some(("2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z")),
        ),
        (
            "ny gap day before",
            &[("30 2 * * *", "1h", NY)],
            "2026-03-07T07:45:00Z",
            Some(("2026-03-07T07:30:00Z", "2026-03-07T08:30:00Z")),
            Some(("2026-03-07T07:30:00Z", "2026-03-07T08:30:00Z")),
        ),
        (
            "ny gap day after",
            &[("30 2 * * *", "1h", NY)],
            "2026-03-08T08:00:00Z",
            None,
            Some(("2026-03-09T06:30:00Z", "2026-03-09T07:30:00Z")),
        ),
        (
            "ny hourly in gap collapses",
            &[("0 * * * *", "30m", NY)],
            "2026-03-08T06:40:00Z",
            None,
            Some(("2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z")),
        ),
        (
            "ny hourly after gap",
            &[("0 * * * *", "30m", NY)],
            "2026-03-08T07:10:00Z",
            Some(("2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z")),
            Some(("2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z")),
        ),
        (
            "ny spanning spring forward",
            &[("0 1 * * *", "3h", NY)],
            "2026-03-08T08:59:59Z",
            Some(("2026-03-08T06:00:00Z", "2026-03-08T09:00:00Z")),
            Some(("2026-03-08T06:00:00Z", "2026-03-08T09:00:00Z")),
        ),
        // Fall back, America/New_York 2026-11-01: 02:00 EDT -> 01:00 EST (06:00Z).
        (
            "ny overlap first pass",
            &[("30 1 * * *", "1h", NY)],
            "2026-11-01T05:30:00Z",
            Some(("2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z")),
            Some(("2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z")),
        ),
        (
            "ny overlap no second opening",
            &[("30 1 * * *", "1h", NY)],
            "2026-11-01T06:45:00Z",
            None,
            Some(("2026-11-02T06:30:00Z", "2026-11-02T07:30:00Z")),
        ),
        (
            "ny overlap closed at end (01:30 EST)",
            &[("30 1 * * *", "1h", NY)],
            "2026-11-01T06:30:00Z",
            None,
            Some(("2026-11-02T06:30:00Z", "2026-11-02T07:30:00Z")),
        ),
        (
            "ny overlap short window not reopened",
            &[("30 1 * * *", "10m", NY)],
            "2026-11-01T06:35:00Z",
            None,
            Some(("2026-11-02T06:30:00Z", "2026-11-02T06:40:00Z")),
        ),
        (
            "ny spanning fall back",
            &[("0 1 * * *", "3h", NY)],
            "2026-11-01T07:59:59Z",
            Some(("2026-11-01T05:00:00Z", "2026-11-01T08:00:00Z")),
            Some(("2026-11-01T05:00:00Z", "2026-11-01T08:00:00Z")),
        ),
        (
            "ny frequent in second pass",
            &[("*/15 * * * *", "30m", NY)],
            "2026-11-01T06:05:00Z",
            Some(("2026-11-01T05:45:00Z", "2026-11-01T06:15:00Z")),
            Some(("2026-11-01T05:45:00Z", "2026-11-01T06:15:00Z")),
        ),
        (
            "ny frequent next after repeat",
            &[("*/15 * * * *", "10m", NY)],
            "2026-11-01T06:05:00Z",
            None,
            Some(("2026-11-01T07:00:00Z", "2026-11-01T07:10:00Z")),
        ),
        // Spring forward, Europe/Berlin 2026-03-29: 02:00 CET -> 03:00 CEST (01:00Z).
        (
            "berlin gap",
            &[("30 2 * * *", "1h", BER)],
            "2026-03-28T23:00:00Z",
            None,
            Some(("2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z")),
        ),
        (
            "berlin gap open",
            &[("30 2 * * *", "1h", BER)],
            "2026-03-29T01:30:00Z",
            Some(("2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z")),
            Some(("2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z")),
        ),
        (
            "berlin spanning spring forward",
            &[("0 1 * * *", "3h", BER)],
            "2026-03-29T02:00:00Z",
            Some(("2026-03-29T00:00:00Z", "2026-03-29T03:00:00Z")),
            Some(("2026-03-29T00:00:00Z", "2026-03-29T03:00:00Z")),
        ),
        // Fall back, Europe/Berlin 2026-10-25: 03:00 CEST -> 02:00 CET (01:00Z).
        (
            "berlin overlap first",
            &[("30 2 * * *", "30m", BER)],
            "2026-10-25T00:40:00Z",
            Some(("2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z")),
            Some(("2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z")),
        ),
        (
            "berlin overlap once",
            &[("30 2 * * *", "30m", BER)],
            "2026-10-25T01:40:00Z",
            None,
            Some(("2026-10-26T01:30:00Z", "2026-10-26T02:00:00Z")),
        ),
        (
            "berlin spanning fall back",
            &[("0 1 * * *", "3h", BER)],
            "2026-10-25T01:59:59Z",
            Some(("2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z")),
            Some(("2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z")),
        ),
    ];

    #[test]
    fn table() {
        for (name, list, now, open, next) in CASES {
            let w = ws(list);
            let now = utc(now);
            assert_eq!(
                w.open_at(now),
                open.map(|(s, e)| span(s, e)),
                "open_at: {name}"
            );
            assert_eq!(w.next(now), next.map(|(s, e)| span(s, e)), "next: {name}");
        }
    }

    #[test]
    fn status_uses_window_offset() {
        let w = ws(&[("0 2 * * *", "3h", Some("Asia/Shanghai"))]);
        assert_eq!(
            w.status(utc("2026-12-02T12:00:00Z")),
            Some(WindowTimes {
                start: "2026-12-03T02:00:00+08:00".into(),
                end: "2026-12-03T05:00:00+08:00".into(),
                open: false,
            })
        );
        assert_eq!(
            w.status(utc("2026-12-02T19:00:00Z")),
            Some(WindowTimes {
                start: "2026-12-03T02:00:00+08:00".into(),
                end: "2026-12-03T05:00:00+08:00".into(),
                open: true,
            })
        );
        // Each window is reported in its own zone.
        let w = ws(&[
            ("0 2 * * *", "3h", Some("Asia/Shanghai")),
            ("0 1 * * *", "3h", NY),
        ]);
        let st = w.status(utc("2026-11-01T04:00:00Z")).expect("a window");
        assert_eq!(st.start, "2026-11-01T01:00:00-04:00");
        assert_eq!(st.end, "2026-11-01T03:00:00-05:00");
        assert!(!st.open);
        // UTC windows use +00:00; sub-second ends keep their fraction.
        let w = ws(&[("0 2 * * *", "1h500ms", None)]);
        let st = w.status(utc("2026-03-10T02:00:00Z")).expect("a window");
        assert_eq!(st.start, "2026-03-10T02:00:00+00:00");
        assert_eq!(st.end, "2026-03-10T03:00:00.500+00:00");
        assert!(st.open);
    }

    #[test]
    fn span_local_strings_across_dst() {
        let w = ws(&[("30 2 * * *", "1h", NY)]);
        let s = w.next(utc("2026-03-08T00:00:00Z")).expect("a window");
        assert_eq!(
            s.start_local(chrono_tz::America::New_York),
            "2026-03-08T03:00:00-04:00"
        );
        assert_eq!(
            s.end_local(chrono_tz::America::New_York),
            "2026-03-08T04:00:00-04:00"
        );
        let w = ws(&[("30 2 * * *", "1h", BER)]);
        let s = w.next(utc("2026-03-28T23:00:00Z")).expect("a window");
        assert_eq!(
            s.start_local(chrono_tz::Europe::Berlin),
            "2026-03-29T03:00:00+02:00"
        );
    }

    #[test]
    fn empty_windows() {
        let w = Windows::parse(&[]).expect("empty is valid");
        assert!(w.is_empty());
        assert_eq!(w.open_at(utc("2026-03-10T02:00:00Z")), None);
        assert_eq!(w.next(utc("2026-03-10T02:00:00Z")), None);
        assert_eq!(w.status(utc("2026-03-10T02:00:00Z")), None);
    }

    fn parse_err(schedule: &str, duration: &str, zone: Option<&str>) -> WindowError {
        let list = [win("0 2 * * *", "1h", None), win(schedule, duration, zone)];
        Windows::parse(&list).expect_err("invalid window")
    }

    #[test]
    fn errors() {
        assert_eq!(
            parse_err("0 2 * * *", "1h", Some("Mars/Olympus")),
            WindowError::BadTimeZone {
                index: 1,
                zone: "Mars/Olympus".into()
            }
        );
        assert!(matches!(
            parse_err("0 2 * * *", "1h", Some("")),
            WindowError::BadTimeZone { index: 1, .. }
        ));
        for bad in [
            "61 * * * *",
            "* * *",
            "",
            "   ",
            "0 0 31 2 *",
            "0 0 30 2 *",
            "0 0 * * * *",
            "0 0 0 * * * *",
            "@daily",
            "0 25 * * *",
            "x y z a b",
            "0 0 * 13 *",
            "0 0 * * 8",
        ] {
            match parse_err(bad, "1h", None) {
                WindowError::BadSchedule {
                    index: 1,
                    schedule,
                    message,
                } => {
                    assert_eq!(schedule, bad);
                    assert!(!message.is_empty());
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(
            parse_err("0 2 * * *", "0s", None),
            WindowError::ZeroDuration { index: 1 }
        );
        assert_eq!(
            parse_err("0 2 * * *", "0", None),
            WindowError::ZeroDuration { index: 1 }
        );
        assert!(matches!(
            parse_err("0 2 * * *", "3d", None),
            WindowError::BadDuration { index: 1, .. }
        ));
        assert!(matches!(
            parse_err("0 2 * * *", "", None),
            WindowError::BadDuration { index: 1, .. }
        ));
        // First error wins, and the message names the field.
        let list = [win("0 2 * * *", "0s", None), win("61 * * * *", "1h", None)];
        let e = Windows::parse(&list).expect_err("invalid");
        assert_eq!(e, WindowError::ZeroDuration { index: 0 });
        assert!(e.to_string().starts_with("spec.windows[0].duration"), "{e}");
        let e = parse_err("61 * * * *", "1h", None);
        assert!(
            e.to_string()
                .starts_with("spec.windows[1].schedule \"61 * * * *\": "),
            "{e}"
        );
        let e = parse_err("0 0 31 2 *", "1h", None);
        assert!(e.to_string().contains("never fires"), "{e}");
        let e = parse_err("0 0 * * * *", "1h", None);
        assert!(e.to_string().contains("expected exactly 5"), "{e}");
        let e = parse_err("0 2 * * *", "1h", Some("Mars/Olympus"));
        assert!(
            e.to_string()
                .starts_with("spec.windows[1].timeZone \"Mars/Olympus\""),
            "{e}"
        );
    }

    #[test]
    fn accepted_syntax() {
        for ok in [
            "0 2 * * *",
            "*/15 1-3 * * *",
            "0 22 * * mon-fri",
            "0 0 L * *",
            "0 0 * * 5L",
            "0 2 * JAN,JUL SUN",
            " 0 2 * * * ",
            "0 0 * 2 1#5",
        ] {
            Windows::parse(&[win(ok, "1h", Some("Europe/Berlin"))])
                .unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
    }

    #[test]
    fn first_instant_rule() {
        let ny = chrono_tz::America::New_York;
        let at = |s: &str| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").expect("naive");
        // Gap: first instant after it.
        assert_eq!(
            first_instant_at_or_after(ny, at("2026-03-08 02:30:00")),
            Some(utc("2026-03-08T07:00:00Z"))
        );
        assert_eq!(
            first_instant_at_or_after(ny, at("2026-03-08 02:00:00")),
            Some(utc("2026-03-08T07:00:00Z"))
        );
        // Overlap: earlier instant.
        assert_eq!(
            first_instant_at_or_after(ny, at("2026-11-01 01:30:00")),
            Some(utc("2026-11-01T05:30:00Z"))
        );
        // A whole skipped day (Samoa, 2011-12-30 did not exist).
        let apia = chrono_tz::Pacific::Apia;
        assert_eq!(
            first_instant_at_or_after(apia, at("2011-12-30 12:00:00")),
            Some(utc("2011-12-30T10:00:00Z")) // 2011-12-31T00:00:00+14:00
        );
    }

    /// The invariants every answer must satisfy, for any instant.
    fn check_invariants(w: &Windows, t: DateTime<Utc>) -> Result<(), TestCaseError> {
        if let Some(s) = w.open_at(t) {
            prop_assert!(s.start <= t && t < s.end, "open_at {t}: {s}");
        }
        let n = w.next(t);
        prop_assert!(n.is_some(), "every schedule here fires again after {t}");
        let n = n.expect("checked");
        prop_assert!(n.start > t || n.contains(t), "next {t}: {n}");
        prop_assert_eq!(n.contains(t), w.open_at(t).is_some());
        // When closed, nothing opens between `t` and the next start.
        if !n.contains(t) {
            let mid = t + (n.start - t) / 2;
            prop_assert!(
                mid == t || w.open_at(mid).is_none(),
                "open at {mid} before next {n}"
            );
        }
        Ok(())
    }

    const PROP_SETS: &[&[(&str, &str, Option<&str>)]] = &[
        &[("0 2 * * *", "3h", None)],
        &[("30 2 * * *", "1h", NY)],
        &[
            ("30 1 * * *", "90m", NY),
            ("0 2 * * *", "3h", Some("Asia/Shanghai")),
        ],
        &[("*/15 * * * *", "20m", BER)],
        &[("0 * * * *", "3h", BER)],
        &[("0 22 * * MON-FRI", "8h", Some("Australia/Lord_Howe"))],
        &[
            ("0 0 29 2 *", "1h", None),
            ("0 3 * * SUN#1", "26h", Some("America/Santiago")),
        ],
        &[("45 2 * * *", "10m", Some("Pacific/Apia"))],
    ];

    /// DST changes used to aim instants at: America/New_York and Europe/Berlin, 2026.
    const TRANSITIONS: &[&str] = &[
        "2026-03-08T07:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-03-29T01:00:00Z",
        "2026-10-25T01:00:00Z",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]
        #[test]
        fn invariants(secs in 946_684_800i64..4_102_444_800i64, which in 0..PROP_SETS.len()) {
            let t = DateTime::from_timestamp(secs, 0).expect("in range");
            check_invariants(&ws(PROP_SETS[which]), t)?;
        }

        #[test]
        fn invariants_near_dst(
            tr in 0..TRANSITIONS.len(),
            offset in -6 * 3600i64..6 * 3600,
            which in 0..PROP_SETS.len(),
        ) {
            let t = utc(TRANSITIONS[tr]) + TimeDelta::seconds(offset);
            check_invariants(&ws(PROP_SETS[which]), t)?;
        }
    }

    /// Compares with a brute-force model of the rule, minute by minute around each DST
    /// change: a window opens at minute `u` when the local clock passes a scheduled time it
    /// has not shown before, i.e. one in `(highest reading so far, reading at u]`.
    #[test]
    fn brute_force_around_dst() {
        let schedules = [
            ("30 2 * * *", "1h"),
            ("30 1 * * *", "45m"),
            ("0 1 * * *", "3h"),
            ("*/15 * * * *", "10m"),
            ("0 * * * *", "90m"),
            ("0 2 * * *", "2h"),
        ];
        for (zone, tr) in [
            ("America/New_York", "2026-03-08T07:00:00Z"),
            ("America/New_York", "2026-11-01T06:00:00Z"),
            ("Europe/Berlin", "2026-03-29T01:00:00Z"),
            ("Europe/Berlin", "2026-10-25T01:00:00Z"),
            ("Australia/Lord_Howe", "2026-04-04T15:00:00Z"),
            ("Australia/Lord_Howe", "2026-10-03T15:30:00Z"),
        ] {
            let tz: Tz = zone.parse().expect("zone");
            let tr = utc(tr);
            for (schedule, duration) in schedules {
                let w = ws(&[(schedule, duration, Some(zone))]);
                let mw = w.iter().next().expect("one window");
                let d = mw.duration();
                let minute = TimeDelta::minutes(1);
                let (lo, hi) = (tr - TimeDelta::hours(12), tr + TimeDelta::hours(12));
                // Model: opening instants from a day before `lo` to a day after `hi`.
                let mut starts = Vec::new();
                let mut u = lo - TimeDelta::days(1);
                let mut highest = (u - minute).with_timezone(&tz).naive_local();
                while u <= hi + TimeDelta::days(1) {
                    let reading = u.with_timezone(&tz).naive_local();
                    let mut n = highest + minute;
                    let mut opens = false;
                    while n <= reading {
                        opens |= mw.cron.is_time_matching(&n).expect("match");
                        n += minute;
                    }
                    if opens {
                        starts.push(u);
                    }
                    highest = highest.max(reading);
                    u += minute;
                }
                let mut t = lo;
                while t <= hi {
                    for t in [t, t + TimeDelta::seconds(30)] {
                        let open = starts
                            .iter()
                            .rev()
                            .find(|s| **s <= t)
                            .filter(|s| t < **s + d)
                            .map(|s| Span {
                                start: *s,
                                end: *s + d,
                            });
                        let next = open.or_else(|| {
                            starts.iter().find(|s| **s > t).map(|s| Span {
                                start: *s,
                                end: *s + d,
                            })
                        });
                        let ctx = format!("{zone} {schedule:?} {duration} at {t}");
                        assert_eq!(w.open_at(t), open, "open_at: {ctx}");
                        assert_eq!(w.next(t), next, "next: {ctx}");
                    }
                    t += minute;
                }
            }
        }
    }
}
