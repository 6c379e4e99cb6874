//! Unix cron expressions, for ActiveMQ's `AMQ_SCHEDULED_CRON` header: parsing the five-field
//! text (`minute hour day-of-month month day-of-week`) and finding the next minute at which it
//! fires, in UTC.
//!
//! Each field is parsed into a bitset of the values it allows, so testing a time is a few bit
//! tests, and the search for the next fire time jumps straight to the next allowed month, day
//! or hour instead of stepping minute by minute. Dates are converted with Howard Hinnant's
//! `days_from_civil` / `civil_from_days` algorithms (proleptic Gregorian calendar), so no date
//! library is needed. The search looks at most [`CRON_SEARCH_HORIZON_DAYS`] ahead: an
//! expression naming a date that never occurs (`0 0 30 2 *`) has no next time, rather than
//! making the caller wait on an unbounded search.
//!
//! Semantics are Vixie cron's (the cron of Linux and the BSDs): day-of-week 7 is Sunday, like
//! 0; `N/S` means `N-max/S`; and when both day-of-month and day-of-week are restricted, a day
//! matches if *either* does. As in Vixie cron, a field counts as unrestricted when its text
//! begins with `*`, so `*/2` in day-of-month still means "and", while `1-31` means "or".

use std::fmt;

/// Longest cron expression accepted, in bytes. Real expressions are a few dozen bytes; the
/// limit bounds parsing work and the size of the text echoed back in errors.
pub const CRON_TEXT_BYTES_MAX: usize = 256;

/// How far past `after_ms` [`Cron::next_after_ms`] looks before answering `None`. Five years
/// (of 366 days, so never short of five calendar years) always contains a February 29 except
/// across a skipped century leap year (2100), and every other valid day/month pair occurs
/// yearly.
pub const CRON_SEARCH_HORIZON_DAYS: u64 = 5 * 366;

/// Bound on the iterations of the search loop in [`Cron::next_after_ms`]. Every iteration
/// either returns, or moves to a later day, except at most one: the first, when it starts in a
/// matching hour after that hour's last matching minute. So the search needs at most
/// `CRON_SEARCH_HORIZON_DAYS + 3` iterations; reaching this bound is a bug.
const SEARCH_STEPS_MAX: u64 = CRON_SEARCH_HORIZON_DAYS + 4;

const MS_PER_MINUTE: u64 = 60_000;
const MINUTES_PER_HOUR: u64 = 60;
const MINUTES_PER_DAY: u64 = 1_440;

/// Day of the week of 1970-01-01 (a Thursday), with 0 = Sunday.
const EPOCH_DAY_OF_WEEK: u64 = 4;

/// A parsed five-field cron expression: minute hour day-of-month month day-of-week, evaluated in UTC.
///
/// Invariant: every bitset is non-empty and has bits only within its field's range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    /// Bit `m` set: minute `m` (0-59) matches.
    minutes: u64,
    /// Bit `h` set: hour `h` (0-23) matches.
    hours: u64,
    /// Bit `d` set: day of month `d` (1-31) matches.
    days_of_month: u64,
    /// Bit `m` set: month `m` (1-12) matches.
    months: u64,
    /// Bit `d` set: day of week `d` (0 = Sunday .. 6 = Saturday) matches; 7 is folded into 0.
    days_of_week: u64,
    /// The day-of-month field began with `*` (Vixie's DOM_STAR).
    day_of_month_star: bool,
    /// The day-of-week field began with `*` (Vixie's DOW_STAR).
    day_of_week_star: bool,
}

/// Why a cron expression was rejected: which field, and what was wrong with it, in words meant
/// for the client that sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    /// `minute`, `hour`, `day-of-month`, `month`, `day-of-week`, or [`CronError::EXPRESSION`]
    /// when the fault is in the expression as a whole (its length or field count).
    pub field: &'static str,
    pub reason: String,
}

impl CronError {
    /// The `field` of an error about the whole expression rather than one field.
    pub const EXPRESSION: &'static str = "expression";

    fn new(field: &'static str, reason: String) -> CronError {
        CronError { field, reason }
    }
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field == CronError::EXPRESSION {
            write!(f, "cron expression: {}", self.reason)
        } else {
            write!(f, "cron field '{}': {}", self.field, self.reason)
        }
    }
}

impl std::error::Error for CronError {}

/// What one field accepts.
struct FieldSpec {
    name: &'static str,
    min: u64,
    max: u64,
    /// Three-letter names accepted in place of numbers, case-insensitively; `names[i]` means
    /// `min + i`.
    names: &'static [&'static str],
    /// For error messages: what a name in this field would be.
    name_kind: &'static str,
}

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

const MINUTE: FieldSpec = FieldSpec {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    name_kind: "",
};
const HOUR: FieldSpec = FieldSpec {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    name_kind: "",
};
const DAY_OF_MONTH: FieldSpec = FieldSpec {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
    name_kind: "",
};
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    names: &MONTH_NAMES,
    name_kind: "month name",
};
/// 0-7 rather than 0-6: both 0 and 7 are Sunday, so that `5-7` (Friday to Sunday) is written
/// naturally. 7 is folded into 0 after parsing.
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &DAY_NAMES,
    name_kind: "day name",
};

impl Cron {
    /// Parses `minute hour day-of-month month day-of-week`, fields separated by ASCII
    /// whitespace. Each field is a comma list of `*`, `N`, `N-M`, `*/S`, `N-M/S` or `N/S`
    /// (`N-max/S`); months may be `JAN`-`DEC` and days of the week `SUN`-`SAT`, in any case.
    pub fn parse(text: &str) -> Result<Cron, CronError> {
        if text.len() > CRON_TEXT_BYTES_MAX {
            return Err(CronError::new(
                CronError::EXPRESSION,
                format!(
                    "expression is {} bytes; the limit is {CRON_TEXT_BYTES_MAX}",
                    text.len()
                ),
            ));
        }
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        let [minute, hour, day_of_month, month, day_of_week] = fields[..] else {
            return Err(CronError::new(
                CronError::EXPRESSION,
                format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                    fields.len()
                ),
            ));
        };
        let day_of_week_bits = parse_field(&DAY_OF_WEEK, day_of_week)?;
        let cron = Cron {
            minutes: parse_field(&MINUTE, minute)?,
            hours: parse_field(&HOUR, hour)?,
            days_of_month: parse_field(&DAY_OF_MONTH, day_of_month)?,
            months: parse_field(&MONTH, month)?,
            days_of_week: (day_of_week_bits | (day_of_week_bits >> 7)) & 0x7f,
            day_of_month_star: day_of_month.starts_with('*'),
            day_of_week_star: day_of_week.starts_with('*'),
        };
        cron.assert_invariants();
        Ok(cron)
    }

    /// The first minute boundary strictly after `after_ms` (Unix epoch milliseconds, UTC) that matches; None if none within 5 years (e.g. "0 0 30 2 *").
    ///
    /// Precisely: `None` when nothing matches within [`CRON_SEARCH_HORIZON_DAYS`] days of the
    /// day `after_ms` falls in, or when the answer would not fit in a `u64`.
    pub fn next_after_ms(&self, after_ms: u64) -> Option<u64> {
        // Minutes since the epoch, and from here on the search is in whole minutes.
        let first_minute = after_ms / MS_PER_MINUTE + 1;
        let mut day = first_minute / MINUTES_PER_DAY;
        let mut minute_of_day = first_minute % MINUTES_PER_DAY;
        // Cannot overflow: `day` is at most u64::MAX / 86_400_000.
        let last_day = day + CRON_SEARCH_HORIZON_DAYS;

        for _ in 0..SEARCH_STEPS_MAX {
            if day > last_day {
                return None;
            }
            let (year, month, day_of_month) = civil_from_days(day);
            if !has(self.months, month) {
                day = self.first_day_of_next_month(year, month);
                minute_of_day = 0;
                continue;
            }
            if !self.day_matches(day, day_of_month) {
                day += 1;
                minute_of_day = 0;
                continue;
            }
            let hour_now = minute_of_day / MINUTES_PER_HOUR;
            let Some(hour) = next_bit(self.hours, hour_now) else {
                day += 1;
                minute_of_day = 0;
                continue;
            };
            let minute_from = if hour == hour_now {
                minute_of_day % MINUTES_PER_HOUR
            } else {
                0
            };
            let Some(minute) = next_bit(self.minutes, minute_from) else {
                // Past this hour's last matching minute. Only possible when `minute_from` is
                // not 0 (`minutes` is never empty), so only on the first iteration. May step
                // to hour 24, which the hour search above sends on to the next day.
                assert!(minute_from > 0, "cron minute set is empty");
                minute_of_day = (hour + 1) * MINUTES_PER_HOUR;
                continue;
            };
            let found_minute = day
                .checked_mul(MINUTES_PER_DAY)?
                .checked_add(hour * MINUTES_PER_HOUR + minute)?;
            assert!(found_minute >= first_minute);
            assert!(self.matches_minute(found_minute));
            return found_minute.checked_mul(MS_PER_MINUTE);
        }
        unreachable!(
            "cron search took {SEARCH_STEPS_MAX} steps without passing its \
             {CRON_SEARCH_HORIZON_DAYS}-day horizon: {self:?} after {after_ms} ms"
        );
    }

    /// Whether the minute `minute` (minutes since the epoch) matches every field.
    fn matches_minute(&self, minute: u64) -> bool {
        let day = minute / MINUTES_PER_DAY;
        let minute_of_day = minute % MINUTES_PER_DAY;
        let (_, month, day_of_month) = civil_from_days(day);
        has(self.months, month)
            && self.day_matches(day, day_of_month)
            && has(self.hours, minute_of_day / MINUTES_PER_HOUR)
            && has(self.minutes, minute_of_day % MINUTES_PER_HOUR)
    }

    /// The Vixie day rule: "or" when both day fields are restricted, "and" otherwise (where an
    /// unrestricted field has every bit set, so "and" reduces to the other field).
    fn day_matches(&self, day: u64, day_of_month: u64) -> bool {
        let by_month = has(self.days_of_month, day_of_month);
        let by_week = has(self.days_of_week, (day + EPOCH_DAY_OF_WEEK) % 7);
        if self.day_of_month_star || self.day_of_week_star {
            by_month && by_week
        } else {
            by_month || by_week
        }
    }

    /// The epoch day of the 1st of the first matching month after `month` of `year`.
    fn first_day_of_next_month(&self, year: u64, month: u64) -> u64 {
        match next_bit(self.months, month + 1) {
            Some(next) => days_from_civil(year, next, 1),
            None => days_from_civil(year + 1, u64::from(self.months.trailing_zeros()), 1),
        }
    }

    fn assert_invariants(&self) {
        let fields = [
            (self.minutes, &MINUTE),
            (self.hours, &HOUR),
            (self.days_of_month, &DAY_OF_MONTH),
            (self.months, &MONTH),
            (self.days_of_week, &DAY_OF_WEEK),
        ];
        for (bits, spec) in fields {
            assert!(bits != 0, "cron field {} parsed to no values", spec.name);
            assert!(
                bits & !range_bits(spec.min, spec.max) == 0,
                "cron field {} parsed to values outside {}-{}",
                spec.name,
                spec.min,
                spec.max
            );
        }
        assert!(
            self.days_of_week < 1 << 7,
            "day-of-week 7 not folded into 0"
        );
    }
}

/// Parses one comma-separated field into a bitset of the values (`spec.min..=spec.max`) it
/// allows. Never empty: a field has at least one item and every item at least one value.
fn parse_field(spec: &FieldSpec, text: &str) -> Result<u64, CronError> {
    let mut bits = 0;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(CronError::new(
                spec.name,
                format!("empty item in list '{}'", text.escape_debug()),
            ));
        }
        bits |= parse_item(spec, item)?;
    }
    Ok(bits)
}

/// Parses `*`, `N`, `N-M`, `*/S`, `N-M/S` or `N/S`.
fn parse_item(spec: &FieldSpec, item: &str) -> Result<u64, CronError> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => (range, Some(parse_step(spec, step)?)),
        None => (item, None),
    };
    let (low, high) = if range == "*" {
        (spec.min, spec.max)
    } else if let Some((low, high)) = range.split_once('-') {
        let low = parse_value(spec, low, item)?;
        let high = parse_value(spec, high, item)?;
        if low > high {
            return Err(CronError::new(
                spec.name,
                format!(
                    "range '{}' is reversed ({low} is after {high})",
                    range.escape_debug()
                ),
            ));
        }
        (low, high)
    } else {
        let value = parse_value(spec, range, item)?;
        // `N/S` is `N-max/S`, as in Vixie cron; a bare `N` is just `N`.
        (value, if step.is_some() { spec.max } else { value })
    };
    let step = step.unwrap_or(1);
    assert!(step >= 1 && high <= spec.max && spec.max < 64);
    Ok((low..=high)
        .step_by(step as usize)
        .fold(0, |bits, v| bits | 1 << v))
}

/// Parses the `S` of `/S`: a decimal number from 1 to the field's maximum (a larger step would
/// select only the start of the range, which is better written as a plain value).
fn parse_step(spec: &FieldSpec, text: &str) -> Result<u64, CronError> {
    let step = parse_number(text).ok_or_else(|| {
        CronError::new(
            spec.name,
            format!("step '{}' is not a number", text.escape_debug()),
        )
    })?;
    match step {
        Some(0) => Err(CronError::new(
            spec.name,
            "step 0 is not allowed; a step must be at least 1".to_string(),
        )),
        Some(step) if step <= spec.max => Ok(step),
        _ => Err(CronError::new(
            spec.name,
            format!("step {text} out of range 1-{}", spec.max),
        )),
    }
}

/// Parses one value of a range: a decimal number within the field's range, or (month and
/// day-of-week only) a three-letter name. `item` is the whole item, for error messages.
fn parse_value(spec: &FieldSpec, text: &str, item: &str) -> Result<u64, CronError> {
    if text.is_empty() {
        return Err(CronError::new(
            spec.name,
            format!("missing value in '{}'", item.escape_debug()),
        ));
    }
    match parse_number(text) {
        Some(Some(value)) if (spec.min..=spec.max).contains(&value) => return Ok(value),
        // Digits, but out of range (possibly beyond u64).
        Some(_) => {
            return Err(CronError::new(
                spec.name,
                format!("value {text} out of range {}-{}", spec.min, spec.max),
            ))
        }
        None => {}
    }
    if let Some(index) = spec
        .names
        .iter()
        .position(|name| name.eq_ignore_ascii_case(text))
    {
        return Ok(spec.min + index as u64);
    }
    let expected = if spec.names.is_empty() {
        "a number".to_string()
    } else {
        format!("a number or {}", spec.name_kind)
    };
    Err(CronError::new(
        spec.name,
        format!("'{}' is not {expected}", text.escape_debug()),
    ))
}

/// `None` if `text` is not all ASCII digits (or is empty); `Some(None)` if it is digits but too
/// large for a `u64`.
fn parse_number(text: &str) -> Option<Option<u64>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().ok())
}

/// Bits `low..=high` set.
fn range_bits(low: u64, high: u64) -> u64 {
    assert!(low <= high && high < 64);
    (u64::MAX >> (63 - high)) & (u64::MAX << low)
}

fn has(bits: u64, value: u64) -> bool {
    value < 64 && bits & (1 << value) != 0
}

/// The lowest set bit of `bits` that is at least `from`.
fn next_bit(bits: u64, from: u64) -> Option<u64> {
    if from >= 64 {
        return None;
    }
    let above = bits & (u64::MAX << from);
    (above != 0).then(|| u64::from(above.trailing_zeros()))
}

/// Howard Hinnant's `days_from_civil`: days since 1970-01-01 of the proleptic Gregorian date
/// `year-month-day`, for dates from 1970 on (so all arithmetic stays unsigned). Years are
/// counted from March (`shifted_year`) so that the leap day is the last day of a year.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    assert!(year >= 1970 && (1..=12).contains(&month) && (1..=31).contains(&day));
    let shifted_year = if month <= 2 { year - 1 } else { year };
    let era = shifted_year / 400;
    let year_of_era = shifted_year - era * 400; // [0, 399]
    let shifted_month = if month > 2 { month - 3 } else { month + 9 }; // March = 0
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1; // [0, 365]
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719_468: days from 0000-03-01 to 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// Howard Hinnant's `civil_from_days`: the (year, month 1-12, day 1-31) of `days` since
/// 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let days = days + 719_468; // now counted from 0000-03-01
    let era = days / 146_097;
    let day_of_era = days - era * 146_097; // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // [0, 399]
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // [0, 365]
    let shifted_month = (5 * day_of_year + 2) / 153; // [0, 11], March = 0
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1; // [1, 31]
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epoch milliseconds of a UTC date and time.
    fn at(year: u64, month: u64, day: u64, hour: u64, minute: u64) -> u64 {
        (days_from_civil(year, month, day) * MINUTES_PER_DAY + hour * 60 + minute) * MS_PER_MINUTE
    }

    fn bits(values: &[u64]) -> u64 {
        values.iter().fold(0, |b, v| b | 1 << v)
    }

    #[test]
    fn civil_conversion_agrees_with_a_naive_calendar_walk() {
        // Known instants, from an independent source (Python's datetime).
        assert_eq!(at(1970, 1, 1, 0, 0), 0);
        assert_eq!(at(2000, 3, 1, 0, 0), 951_868_800_000);
        assert_eq!(at(2026, 1, 1, 0, 0), 1_767_225_600_000);
        assert_eq!(at(2028, 2, 29, 0, 0), 1_835_395_200_000);

        let month_days = |year: u64, month: u64| match month {
            2 if year.is_multiple_of(4)
                && (!year.is_multiple_of(100) || year.is_multiple_of(400)) =>
            {
                29
            }
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let (mut year, mut month, mut day) = (1970, 1, 1);
        for days in 0..days_from_civil(2500, 1, 1) {
            assert_eq!(civil_from_days(days), (year, month, day), "day {days}");
            assert_eq!(days_from_civil(year, month, day), days);
            day += 1;
            if day > month_days(year, month) {
                day = 1;
                month += 1;
                if month > 12 {
                    month = 1;
                    year += 1;
                }
            }
        }
    }

    #[test]
    fn parse_rejects_bad_expressions_naming_field_and_reason() {
        let too_long = format!("{}0 * * * *", "0,".repeat(124));
        let cases: &[(&str, &str, &str)] = &[
            ("", "expression", "expected 5 fields"),
            ("* * * *", "expression", "found 4"),
            ("* * * * * *", "expression", "found 6"),
            ("@daily", "expression", "found 1"),
            (&too_long, "expression", "is 257 bytes; the limit is 256"),
            ("60 * * * *", "minute", "value 60 out of range 0-59"),
            ("* 25 * * *", "hour", "value 25 out of range 0-23"),
            ("* * 0 * *", "day-of-month", "value 0 out of range 1-31"),
            ("* * 32 * *", "day-of-month", "value 32 out of range 1-31"),
            ("* * * 13 *", "month", "value 13 out of range 1-12"),
            ("* * * * 8", "day-of-week", "value 8 out of range 0-7"),
            (
                "99999999999999999999 * * * *",
                "minute",
                "value 99999999999999999999 out of range 0-59",
            ),
            ("*/0 * * * *", "minute", "step 0 is not allowed"),
            ("* 1-5/0 * * *", "hour", "step 0 is not allowed"),
            ("*/60 * * * *", "minute", "step 60 out of range 1-59"),
            ("*/x * * * *", "minute", "step 'x' is not a number"),
            ("*/ * * * *", "minute", "step '' is not a number"),
            ("*/5/2 * * * *", "minute", "step '5/2' is not a number"),
            ("* * * * 5-1", "day-of-week", "range '5-1' is reversed"),
            ("* * * DEC-JAN *", "month", "range 'DEC-JAN' is reversed"),
            ("x * * * *", "minute", "'x' is not a number"),
            ("* MON * * *", "hour", "'MON' is not a number"),
            (
                "* * * JAN-MON *",
                "month",
                "'MON' is not a number or month name",
            ),
            (
                "* * * * MONDAY",
                "day-of-week",
                "'MONDAY' is not a number or day name",
            ),
            ("1,,2 * * * *", "minute", "empty item in list '1,,2'"),
            ("1, * * * *", "minute", "empty item"),
            ("-5 * * * *", "minute", "missing value in '-5'"),
            ("5- * * * *", "minute", "missing value in '5-'"),
            ("1-2-3 * * * *", "minute", "'2-3' is not a number"),
            ("*-5 * * * *", "minute", "'*' is not a number"),
            ("** * * * *", "minute", "'**' is not a number"),
            ("? * * * *", "minute", "'?' is not a number"),
            ("+5 * * * *", "minute", "'+5' is not a number"),
            ("é * * * *", "minute", "'é' is not a number"),
            ("\0 * * * *", "minute", "'\\0' is not a number"),
        ];
        for &(text, field, reason) in cases {
            let error = Cron::parse(text).expect_err(text);
            assert_eq!(error.field, field, "{text:?}: {error}");
            assert!(
                error.reason.contains(reason),
                "{text:?}: reason {:?} lacks {reason:?}",
                error.reason
            );
        }
    }

    #[test]
    fn error_display_names_the_field() {
        let error = Cron::parse("* 25 * * *").unwrap_err();
        assert_eq!(
            error.to_string(),
            "cron field 'hour': value 25 out of range 0-23"
        );
        let error = Cron::parse("* *").unwrap_err();
        assert_eq!(
            error.to_string(),
            "cron expression: expected 5 fields (minute hour day-of-month month day-of-week), found 2"
        );
    }

    #[test]
    fn parse_builds_the_expected_sets() {
        let all_minutes = range_bits(0, 59);
        let cases: &[(&str, u64, u64, u64, u64, u64)] = &[
            (
                "* * * * *",
                all_minutes,
                range_bits(0, 23),
                range_bits(1, 31),
                range_bits(1, 12),
                range_bits(0, 6),
            ),
            (
                "*/15 0-6/3 1,15,31 */4 1-5",
                bits(&[0, 15, 30, 45]),
                bits(&[0, 3, 6]),
                bits(&[1, 15, 31]),
                bits(&[1, 5, 9]),
                bits(&[1, 2, 3, 4, 5]),
            ),
            // `N/S` is `N-max/S`.
            (
                "5/20 20/2 30/1 11/1 6/1",
                bits(&[5, 25, 45]),
                bits(&[20, 22]),
                bits(&[30, 31]),
                bits(&[11, 12]),
                bits(&[0, 6]),
            ),
            // Names in any case, alone, in ranges and lists, with steps.
            (
                "0 0 1 jan,Jul,DEC-dec * ",
                bits(&[0]),
                bits(&[0]),
                bits(&[1]),
                bits(&[1, 7, 12]),
                range_bits(0, 6),
            ),
            (
                "0 0 1 FEB-Aug/2 mon-FRI/2,sun",
                bits(&[0]),
                bits(&[0]),
                bits(&[1]),
                bits(&[2, 4, 6, 8]),
                bits(&[0, 1, 3, 5]),
            ),
            // Day-of-week 7 is Sunday, alone and as the end of a range.
            (
                "0\t0\t1\t1\t7",
                bits(&[0]),
                bits(&[0]),
                bits(&[1]),
                bits(&[1]),
                bits(&[0]),
            ),
            (
                "  0  0 1 1 5-7  ",
                bits(&[0]),
                bits(&[0]),
                bits(&[1]),
                bits(&[1]),
                bits(&[0, 5, 6]),
            ),
            (
                "0 0 1 1 0-7",
                bits(&[0]),
                bits(&[0]),
                bits(&[1]),
                bits(&[1]),
                range_bits(0, 6),
            ),
            // Leading zeros are just digits.
            (
                "007 08 09 010 00",
                bits(&[7]),
                bits(&[8]),
                bits(&[9]),
                bits(&[10]),
                bits(&[0]),
            ),
        ];
        for &(text, minutes, hours, days_of_month, months, days_of_week) in cases {
            let cron = Cron::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(cron.minutes, minutes, "{text:?} minutes");
            assert_eq!(cron.hours, hours, "{text:?} hours");
            assert_eq!(cron.days_of_month, days_of_month, "{text:?} days of month");
            assert_eq!(cron.months, months, "{text:?} months");
            assert_eq!(cron.days_of_week, days_of_week, "{text:?} days of week");
        }
        assert_eq!(
            Cron::parse("0 0 * * 7").unwrap(),
            Cron::parse("0 0 * * 0").unwrap()
        );
        assert_eq!(
            Cron::parse("0 0 * * SUN").unwrap(),
            Cron::parse("0 0 * * 0").unwrap()
        );
        let longest = format!("{}00 * * * *", "0,".repeat(123));
        assert_eq!(longest.len(), CRON_TEXT_BYTES_MAX);
        assert!(Cron::parse(&longest).is_ok());
    }

    type Time = (u64, u64, u64, u64, u64);

    #[test]
    fn next_after_finds_the_next_matching_minute() {
        let t = |(y, mo, d, h, mi): Time| at(y, mo, d, h, mi);
        // (expression, after, extra ms past `after`, expected)
        let cases: &[(&str, Time, u64, Option<Time>)] = &[
            // Every minute: the next boundary, strictly after even on a boundary.
            (
                "* * * * *",
                (2026, 1, 1, 10, 0),
                0,
                Some((2026, 1, 1, 10, 1)),
            ),
            (
                "* * * * *",
                (2026, 1, 1, 10, 0),
                1,
                Some((2026, 1, 1, 10, 1)),
            ),
            (
                "* * * * *",
                (2026, 1, 1, 10, 0),
                59_999,
                Some((2026, 1, 1, 10, 1)),
            ),
            (
                "* * * * *",
                (2026, 1, 1, 23, 59),
                0,
                Some((2026, 1, 2, 0, 0)),
            ),
            // Every 15 minutes.
            (
                "*/15 * * * *",
                (2026, 1, 1, 10, 7),
                0,
                Some((2026, 1, 1, 10, 15)),
            ),
            (
                "*/15 * * * *",
                (2026, 1, 1, 10, 45),
                0,
                Some((2026, 1, 1, 11, 0)),
            ),
            (
                "*/15 * * * *",
                (2026, 1, 1, 23, 50),
                0,
                Some((2026, 1, 2, 0, 0)),
            ),
            // A specific time: later today, or tomorrow once it has passed or is now.
            (
                "30 9 * * *",
                (2026, 1, 1, 9, 29),
                59_999,
                Some((2026, 1, 1, 9, 30)),
            ),
            (
                "30 9 * * *",
                (2026, 1, 1, 9, 30),
                0,
                Some((2026, 1, 2, 9, 30)),
            ),
            (
                "30 9 * * *",
                (2026, 1, 1, 9, 31),
                0,
                Some((2026, 1, 2, 9, 30)),
            ),
            (
                "30 9,17 * * *",
                (2026, 1, 1, 9, 30),
                0,
                Some((2026, 1, 1, 17, 30)),
            ),
            // Starting late in a matching hour moves on to the next matching hour.
            (
                "10 9-10 * * *",
                (2026, 1, 1, 9, 40),
                0,
                Some((2026, 1, 1, 10, 10)),
            ),
            (
                "10 9 * * *",
                (2026, 1, 1, 9, 40),
                0,
                Some((2026, 1, 2, 9, 10)),
            ),
            // Months by name; the skip lands on the 1st of the month.
            (
                "0 12 * JAN,jul *",
                (2026, 2, 1, 0, 0),
                0,
                Some((2026, 7, 1, 12, 0)),
            ),
            (
                "0 12 * JAN,jul *",
                (2026, 7, 31, 12, 0),
                0,
                Some((2027, 1, 1, 12, 0)),
            ),
            // Days by name. 2026-01-01 is a Thursday; 01-03 a Saturday.
            (
                "0 0 * * mon-fri",
                (2026, 1, 3, 0, 0),
                0,
                Some((2026, 1, 5, 0, 0)),
            ),
            (
                "0 0 * * MON-FRI",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 2, 0, 0)),
            ),
            // Day-of-week 7 and 0 and SUN are all Sunday (2026-01-04).
            ("0 0 * * 7", (2026, 1, 1, 0, 0), 0, Some((2026, 1, 4, 0, 0))),
            ("0 0 * * 0", (2026, 1, 1, 0, 0), 0, Some((2026, 1, 4, 0, 0))),
            (
                "0 0 * * sun",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 4, 0, 0)),
            ),
            (
                "0 0 * * 6-7",
                (2026, 1, 4, 0, 0),
                0,
                Some((2026, 1, 10, 0, 0)),
            ),
            // Both day fields restricted: either matches (Friday, or the 13th).
            (
                "0 0 13 * FRI",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 2, 0, 0)),
            ),
            (
                "0 0 13 * FRI",
                (2026, 1, 9, 0, 0),
                0,
                Some((2026, 1, 13, 0, 0)),
            ),
            (
                "0 0 13 * FRI",
                (2026, 1, 13, 0, 0),
                0,
                Some((2026, 1, 16, 0, 0)),
            ),
            // Only one restricted: that one decides.
            (
                "0 0 13 * *",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 13, 0, 0)),
            ),
            (
                "0 0 * * FRI",
                (2026, 1, 2, 0, 0),
                0,
                Some((2026, 1, 9, 0, 0)),
            ),
            // A field starting with `*` counts as unrestricted (Vixie): odd days that are
            // Mondays (Jan 5, Jan 19), not odd days or Mondays (which would be Jan 3).
            (
                "0 0 */2 * MON",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 5, 0, 0)),
            ),
            (
                "0 0 */2 * MON",
                (2026, 1, 5, 0, 0),
                0,
                Some((2026, 1, 19, 0, 0)),
            ),
            // ...whereas `1-31/2` is restricted, so "or" applies.
            (
                "0 0 1-31/2 * MON",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 1, 3, 0, 0)),
            ),
            // Day 31 skips the months without one.
            (
                "0 0 31 * *",
                (2026, 1, 31, 0, 0),
                0,
                Some((2026, 3, 31, 0, 0)),
            ),
            // February 29 waits for a leap year.
            (
                "0 0 29 2 *",
                (2026, 3, 1, 0, 0),
                0,
                Some((2028, 2, 29, 0, 0)),
            ),
            (
                "0 0 29 2 *",
                (2028, 2, 28, 23, 59),
                0,
                Some((2028, 2, 29, 0, 0)),
            ),
            (
                "0 0 29 2 *",
                (2000, 1, 1, 0, 0),
                0,
                Some((2000, 2, 29, 0, 0)),
            ),
            // ...but 2100 is not one, and 2104 is beyond the horizon.
            ("0 0 29 2 *", (2097, 3, 1, 0, 0), 0, None),
            // Dates that never occur.
            ("0 0 30 2 *", (2026, 1, 1, 0, 0), 0, None),
            ("0 0 31 4,6,9,11 *", (2026, 1, 1, 0, 0), 0, None),
            // ...unless the day-of-week gives another way to match.
            (
                "0 0 30 2 MON",
                (2026, 1, 1, 0, 0),
                0,
                Some((2026, 2, 2, 0, 0)),
            ),
            // Year rollover.
            (
                "0 0 1 1 *",
                (2026, 12, 31, 23, 59),
                0,
                Some((2027, 1, 1, 0, 0)),
            ),
            (
                "59 23 31 12 *",
                (2026, 12, 31, 23, 59),
                0,
                Some((2027, 12, 31, 23, 59)),
            ),
            ("0 0 * 1 *", (2026, 2, 1, 0, 0), 0, Some((2027, 1, 1, 0, 0))),
            // From the epoch itself.
            ("0 0 * * *", (1970, 1, 1, 0, 0), 0, Some((1970, 1, 2, 0, 0))),
        ];
        for &(text, after, extra_ms, expected) in cases {
            let cron = Cron::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let after_ms = t(after) + extra_ms;
            assert_eq!(
                cron.next_after_ms(after_ms),
                expected.map(t),
                "{text:?} after {after:?} + {extra_ms} ms"
            );
        }
    }

    #[test]
    fn next_after_near_the_end_of_time_is_none_not_a_panic() {
        let every_minute = Cron::parse("* * * * *").unwrap();
        assert_eq!(every_minute.next_after_ms(u64::MAX), None);
        // The last representable minute boundary is found; nothing after it is.
        let last_minute_ms = u64::MAX / MS_PER_MINUTE * MS_PER_MINUTE;
        assert_eq!(every_minute.next_after_ms(last_minute_ms), None);
        assert_eq!(
            every_minute.next_after_ms(last_minute_ms - MS_PER_MINUTE),
            Some(last_minute_ms)
        );
        let yearly = Cron::parse("0 0 1 1 *").unwrap();
        assert_eq!(yearly.next_after_ms(u64::MAX - 1), None);
    }

    #[test]
    fn next_after_never_exceeds_its_step_bound() {
        // The slowest searches: a day rule that matches rarely or never, from many starts.
        for text in [
            "0 0 29 2 *",
            "0 0 30 2 *",
            "59 23 31 12 *",
            "0 0 31 4,6,9,11 *",
        ] {
            let cron = Cron::parse(text).unwrap();
            for year in 1970..2500 {
                for month in [1, 2, 3, 12] {
                    let _ = cron.next_after_ms(at(year, month, 28, 23, 59) + 30_000);
                }
            }
        }
    }

    /// For expressions that fire at least every few days, the answer for many pseudo-random
    /// instants is the first matching minute after them, checked minute by minute.
    #[test]
    fn next_after_is_the_first_match_by_brute_force() {
        const BRUTE_FORCE_MINUTES_MAX: u64 = 8 * MINUTES_PER_DAY;
        const SAMPLES: u32 = 150;
        let expressions = [
            "* * * * *",
            "*/15 * * * *",
            "5 */2 * * *",
            "0,30 9-17 * * MON-FRI",
            "*/7 3,5 * * *",
            "59 23 * * *",
            "30 12 1,15 * 1",
            "0 0 1-31/3 * sat",
            "17 4 * * 0,3",
            "0 0 31 * 5-7",
            "45 1/5 29 * TUE",
        ];
        // Knuth's MMIX LCG; deterministic, so a failure replays.
        let mut state: u64 = 0x5eed;
        let mut next_random = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 11
        };
        let span_ms = at(2200, 1, 1, 0, 0);
        for text in expressions {
            let cron = Cron::parse(text).unwrap();
            for _ in 0..SAMPLES {
                // Mostly arbitrary milliseconds; sometimes an exact minute boundary.
                let mut after_ms = next_random() % span_ms;
                if next_random() % 4 == 0 {
                    after_ms -= after_ms % MS_PER_MINUTE;
                }
                let result = cron
                    .next_after_ms(after_ms)
                    .unwrap_or_else(|| panic!("{text:?} after {after_ms}: no match"));
                assert!(result > after_ms, "{text:?} after {after_ms}: {result}");
                assert_eq!(result % MS_PER_MINUTE, 0, "{text:?} after {after_ms}");
                assert!(cron.matches_minute(result / MS_PER_MINUTE));
                let first_minute = after_ms / MS_PER_MINUTE + 1;
                let result_minute = result / MS_PER_MINUTE;
                assert!(
                    result_minute - first_minute < BRUTE_FORCE_MINUTES_MAX,
                    "{text:?} after {after_ms}: {result} is further than expected"
                );
                for minute in first_minute..result_minute {
                    assert!(
                        !cron.matches_minute(minute),
                        "{text:?} after {after_ms}: minute {minute} matches before {result}"
                    );
                }
            }
        }
    }

    /// `matches_minute` is what the brute-force test trusts, so check it against the calendar
    /// directly, field by field.
    #[test]
    fn matches_minute_checks_each_field() {
        let cron = Cron::parse("30 9 13 1 FRI").unwrap();
        let minute = |y, mo, d, h, mi| at(y, mo, d, h, mi) / MS_PER_MINUTE;
        assert!(cron.matches_minute(minute(2026, 1, 13, 9, 30))); // Tuesday the 13th
        assert!(cron.matches_minute(minute(2026, 1, 16, 9, 30))); // Friday
        assert!(!cron.matches_minute(minute(2026, 1, 14, 9, 30))); // Wednesday
        assert!(!cron.matches_minute(minute(2026, 2, 13, 9, 30))); // February
        assert!(!cron.matches_minute(minute(2026, 1, 13, 10, 30)));
        assert!(!cron.matches_minute(minute(2026, 1, 13, 9, 31)));
    }
}
