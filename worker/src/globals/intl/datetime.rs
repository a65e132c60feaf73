//! Intl.DateTimeFormat on ICU4X: CLDR patterns chosen from ECMA-402's options (the component
//! options mapped to a field set, or `dateStyle`/`timeStyle` as a field set), the
//! Gregorian calendar, and zone names from ICU4X's metazone data. Wall-clock fields come from
//! `zone.rs` (the tz database with its rules).

use super::parts::{collect, collect_range, Piece};
use super::zone::{self, Zone};
use icu::calendar::{Date, Gregorian};
use icu::datetime::fieldsets::builder::{DateFields, FieldSetBuilder, ZoneStyle};
use icu::datetime::fieldsets::enums::CompositeFieldSet;
use icu::datetime::options::{Alignment, Length, SubsecondDigits, TimePrecision, YearStyle};
use icu::datetime::preferences::HourCycle;
use icu::datetime::range::FixedCalendarDateRangeFormatter;
use icu::datetime::{DateTimeFormatterPreferences, FixedCalendarDateTimeFormatter};
use icu::locale::Locale;
use icu::time::zone::{IanaParser, UtcOffset, ZoneNameTimestamp};
use icu::time::{Time, TimeZoneInfo, ZonedDateTime};
use serde_json::Value;

pub(crate) struct DateTimeFormatter {
    f: FixedCalendarDateTimeFormatter<Gregorian, CompositeFieldSet>,
    zone: Zone,
    /// ECMA-402's h24 (hours 1-24), which CLDR data does not offer: formatted as h23 with the
    /// midnight hour written 24.
    h24: bool,
}

fn text<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o.get(k).and_then(Value::as_str)
}

fn style_length(s: &str) -> Length {
    match s {
        "full" | "long" => Length::Long,
        "medium" => Length::Medium,
        _ => Length::Short,
    }
}

/// The field set for `dateStyle`/`timeStyle`.
fn styles(date: Option<&str>, time: Option<&str>) -> Result<CompositeFieldSet, String> {
    let mut b = FieldSetBuilder::new();
    b.length = Some(style_length(date.or(time).unwrap_or("medium")));
    if let Some(d) = date {
        b.date_fields = Some(if d == "full" {
            DateFields::YMDE
        } else {
            DateFields::YMD
        });
    }
    if let Some(t) = time {
        b.time_precision = Some(if t == "short" {
            TimePrecision::Minute
        } else {
            TimePrecision::Second
        });
        b.zone_style = match t {
            "full" => Some(ZoneStyle::SpecificLong),
            "long" => Some(ZoneStyle::SpecificShort),
            _ => None,
        };
    }
    b.build_composite().map_err(|e| format!("{e:?}"))
}

/// The field set for ECMA-402's component options, chosen as ICU4X 2.4's `DateTimeFieldBag`
/// does (ICU4X has semantic skeletons, not ICU4C's free skeleton matching): the month's width
/// (else the weekday's) sets the length, the fields present pick the date fields (a date with only some of
/// year, month, day grows to the nearest CLDR set), a numeric year is written in full, and a
/// 2-digit month, day or hour asks for column alignment.
fn components(o: &Value) -> Result<CompositeFieldSet, String> {
    let (era, year, month, day, weekday) = (
        text(o, "era"),
        text(o, "year"),
        text(o, "month"),
        text(o, "day"),
        text(o, "weekday"),
    );
    let mut b = FieldSetBuilder::new();
    // The month's width decides (a numeric month keeps a numeric pattern beside a weekday);
    // without a month, the weekday's.
    let width = month.or(weekday);
    b.length = match width {
        Some("long") => Some(Length::Long),
        Some("short" | "narrow") => Some(Length::Medium),
        Some(_) => Some(Length::Short),
        None => None,
    };
    let has_year = era.is_some() || year.is_some();
    b.date_fields = match (has_year, month.is_some(), day.is_some(), weekday.is_some()) {
        (false, false, false, false) => None,
        (true, false, false, false) => Some(DateFields::Y),
        (false, true, false, false) => Some(DateFields::M),
        (true, true, false, false) => Some(DateFields::YM),
        (false, false, true, false) => Some(DateFields::D),
        (false, true, true, false) => Some(DateFields::MD),
        (true, _, true, false) => Some(DateFields::YMD),
        (false, false, false, true) => Some(DateFields::E),
        (false, false, true, true) => Some(DateFields::DE),
        (false, true, _, true) => Some(DateFields::MDE),
        (true, _, _, true) => Some(DateFields::YMDE),
    };
    b.time_precision = match o.get("fractionalSecondDigits").and_then(Value::as_u64) {
        Some(1) => Some(TimePrecision::Subsecond(SubsecondDigits::S1)),
        Some(2) => Some(TimePrecision::Subsecond(SubsecondDigits::S2)),
        Some(3) => Some(TimePrecision::Subsecond(SubsecondDigits::S3)),
        _ if text(o, "second").is_some() => Some(TimePrecision::Second),
        _ if text(o, "minute").is_some() => Some(TimePrecision::Minute),
        _ if text(o, "hour").is_some() => Some(TimePrecision::Hour),
        _ => None,
    };
    b.zone_style = text(o, "timeZoneName").map(|v| match v {
        "long" => ZoneStyle::SpecificLong,
        "shortOffset" => ZoneStyle::LocalizedOffsetShort,
        "longOffset" => ZoneStyle::LocalizedOffsetLong,
        "shortGeneric" => ZoneStyle::GenericShort,
        "longGeneric" => ZoneStyle::GenericLong,
        _ => ZoneStyle::SpecificShort,
    });
    // A month or year alone cannot carry a time or a zone: the date grows to year-month-day.
    if b.time_precision.is_some() || b.zone_style.is_some() {
        if b.date_fields.is_some_and(DateFields::is_calendar_period) {
            b.date_fields = Some(DateFields::YMD);
        }
    } else if b.date_fields.is_none() {
        b.date_fields = Some(DateFields::YMD);
    }
    if month == Some("2-digit") || day == Some("2-digit") || text(o, "hour") == Some("2-digit") {
        b.alignment = Some(Alignment::Column);
    }
    b.year_style = match (era, year) {
        (Some(_), _) => Some(YearStyle::WithEra),
        (None, Some("2-digit")) => Some(YearStyle::Auto),
        (None, Some(_)) => Some(YearStyle::Full),
        _ => None,
    };
    b.build_composite().map_err(|e| format!("{e:?}"))
}

type Setup = (DateTimeFormatterPreferences, CompositeFieldSet, Zone, bool);

/// Preferences, field set, zone and whether the hour cycle is h24, for resolved options `o`.
fn setup(locale: &Locale, o: &Value) -> Result<Setup, String> {
    let zone_name = text(o, "timeZone").unwrap_or("UTC");
    let zone =
        zone::zone(zone_name).ok_or_else(|| format!("Invalid time zone specified: {zone_name}"))?;
    let mut prefs = DateTimeFormatterPreferences::from(locale);
    let hc = text(o, "hourCycle");
    prefs.hour_cycle = match hc {
        Some("h11") => Some(HourCycle::H11),
        Some("h12") => Some(HourCycle::H12),
        Some("h23" | "h24") => Some(HourCycle::H23),
        _ => None,
    };
    let fields = if text(o, "dateStyle").is_some() || text(o, "timeStyle").is_some() {
        styles(text(o, "dateStyle"), text(o, "timeStyle"))?
    } else {
        components(o)?
    };
    Ok((prefs, fields, zone, hc == Some("h24")))
}

type Input = ZonedDateTime<Gregorian, TimeZoneInfo<icu::time::zone::models::AtTime>>;

/// ICU4X's input for `epoch_ms` in `zone`.
fn input(zone: &Zone, epoch_ms: i64) -> Result<Input, String> {
    let l = zone::local(&zone.tz, epoch_ms);
    let year = i32::try_from(l.year).map_err(|_| "Invalid time value".to_string())?;
    let date = Date::try_new_gregorian(year, l.month, l.day)
        .map_err(|_| "Date value out of range for formatting (years -9999 to 9999)".to_string())?;
    let time = Time::try_new(
        l.hour,
        l.minute,
        l.second,
        u32::from(l.millisecond) * 1_000_000,
    )
    .map_err(|e| e.to_string())?;
    let id = if zone.name == "UTC" {
        icu::time::TimeZone::from_iana_id("Etc/UTC")
    } else {
        IanaParser::new().parse(&zone.name)
    };
    let offset = UtcOffset::try_from_seconds(l.offset_seconds).ok();
    let info =
        id.with_offset(offset)
            .with_zone_name_timestamp(ZoneNameTimestamp::from_epoch_seconds(
                epoch_ms.div_euclid(1000),
            ));
    Ok(ZonedDateTime {
        date,
        time,
        zone: info,
    })
}

/// Writes the midnight hour as 24 for the h24 cycle.
fn fix_h24(kind: &str, value: &mut String) {
    if kind == "hour" && value.chars().all(|c| c == '0') {
        *value = "24".into();
    }
}

/// `formatRange`: ICU4X's interval patterns (the fields both ends share are written once).
pub(crate) struct DateRangeFormatter {
    f: FixedCalendarDateRangeFormatter<Gregorian, CompositeFieldSet>,
    zone: Zone,
    h24: bool,
}

impl DateRangeFormatter {
    pub(crate) fn new(locale: &Locale, o: &Value) -> Result<Self, String> {
        let (prefs, fields, zone, h24) = setup(locale, o)?;
        let f =
            FixedCalendarDateRangeFormatter::try_new(prefs, fields).map_err(|e| e.to_string())?;
        Ok(Self { f, zone, h24 })
    }

    /// The pieces of the range, each with its source (startRange, endRange, shared).
    pub(crate) fn format(&self, a: i64, b: i64) -> Result<Vec<(String, String, String)>, String> {
        let (a, b) = (input(&self.zone, a)?, input(&self.zone, b)?);
        let mut pieces = collect_range(&self.f.format(&a, &b));
        if self.h24 {
            pieces.iter_mut().for_each(|(k, v, _)| fix_h24(k, v));
        }
        Ok(pieces)
    }
}

impl DateTimeFormatter {
    /// Builds the formatter for resolved options `o` (see intl.js `DateTimeFormat`).
    pub(crate) fn new(locale: &Locale, o: &Value) -> Result<Self, String> {
        let (prefs, fields, zone, h24) = setup(locale, o)?;
        let f =
            FixedCalendarDateTimeFormatter::try_new(prefs, fields).map_err(|e| e.to_string())?;
        Ok(Self { f, zone, h24 })
    }

    /// The zone's reported name (`resolvedOptions().timeZone`).
    pub(crate) fn zone_name(&self) -> &str {
        &self.zone.name
    }

    /// The hour cycle of the pattern ICU4X chose for `epoch_ms` (h11, h12, h23 or h24), or
    /// None when it shows no hour.
    pub(crate) fn hour_cycle(&self) -> Option<&'static str> {
        let pattern = input(&self.zone, 0)
            .ok()
            .map(|i| self.f.format(&i).pattern().to_string())?;
        let mut quoted = false;
        for c in pattern.chars() {
            match c {
                '\'' => quoted = !quoted,
                'h' if !quoted => return Some("h12"),
                'H' if !quoted => return Some(if self.h24 { "h24" } else { "h23" }),
                'K' if !quoted => return Some("h11"),
                'k' if !quoted => return Some("h24"),
                _ => {}
            }
        }
        None
    }

    /// The parts of `epoch_ms` formatted.
    pub(crate) fn format(&self, epoch_ms: i64) -> Result<Vec<Piece>, String> {
        let mut pieces = collect(&self.f.format(&input(&self.zone, epoch_ms)?));
        if self.h24 {
            pieces.iter_mut().for_each(|(k, v)| fix_h24(k, v));
        }
        Ok(pieces)
    }
}
