//! Wall-clock time of an instant in an IANA zone, from the tz database compiled into the binary
//! (jiff's bundled copy: nothing is read at run time). Past the database's last listed
//! transition jiff applies the zone's POSIX rule, so daylight saving goes on in 2101 and later.
//! Instants outside jiff's range (years -9999..=9999; JavaScript dates reach ±275760) take the
//! offset of the same moment shifted by whole 400-year Gregorian cycles, which repeat exactly.

use jiff::tz::TimeZone;
use jiff::Timestamp;

/// A zone and the name it is reported by.
pub(crate) struct Zone {
    pub(crate) tz: TimeZone,
    pub(crate) name: String,
}

/// The zone called `name` (case-insensitive), or None when the database has no such zone.
pub(crate) fn zone(name: &str) -> Option<Zone> {
    let upper = name.to_ascii_uppercase();
    if matches!(upper.as_str(), "UTC" | "ETC/UTC" | "GMT" | "ETC/GMT" | "Z") {
        return Some(Zone {
            tz: TimeZone::UTC,
            name: "UTC".into(),
        });
    }
    let tz = jiff::tz::db().get(name).ok()?;
    let name = tz.iana_name().unwrap_or(name).to_string();
    Some(Zone { tz, name })
}

/// Local wall-clock fields. `year` is the proleptic Gregorian year (0 is 1 BC, -1 is 2 BC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Local {
    pub(crate) year: i64,
    pub(crate) month: u8,
    pub(crate) day: u8,
    pub(crate) hour: u8,
    pub(crate) minute: u8,
    pub(crate) second: u8,
    pub(crate) millisecond: u16,
    /// 0 is Sunday.
    pub(crate) weekday: u8,
    pub(crate) offset_seconds: i32,
    pub(crate) abbreviation: String,
}

const MS_PER_DAY: i64 = 86_400_000;
/// 400 Gregorian years: 146097 days, a whole number of weeks.
const CYCLE_MS: i64 = 146_097 * MS_PER_DAY;

/// The offset (seconds) and abbreviation of `zone` at `epoch_ms`.
fn offset_at(zone: &TimeZone, epoch_ms: i64) -> (i32, String) {
    let min = Timestamp::MIN.as_millisecond() + MS_PER_DAY;
    let max = Timestamp::MAX.as_millisecond() - MS_PER_DAY;
    let mut ms = epoch_ms;
    while ms < min {
        ms += CYCLE_MS;
    }
    while ms > max {
        ms -= CYCLE_MS;
    }
    match Timestamp::from_millisecond(ms) {
        Ok(ts) => {
            let info = zone.to_offset_info(ts);
            (info.offset().seconds(), info.abbreviation().to_string())
        }
        Err(_) => (0, "UTC".into()),
    }
}

/// Civil date of a day count from 1970-01-01 (H. Hinnant's algorithm, any range).
fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The wall-clock fields of `epoch_ms` (whole milliseconds) in `zone`.
pub(crate) fn local(zone: &TimeZone, epoch_ms: i64) -> Local {
    let (offset_seconds, abbreviation) = offset_at(zone, epoch_ms);
    let ms = epoch_ms + i64::from(offset_seconds) * 1000;
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    Local {
        year,
        month,
        day,
        hour: (in_day / 3_600_000) as u8,
        minute: (in_day / 60_000 % 60) as u8,
        second: (in_day / 1000 % 60) as u8,
        millisecond: (in_day % 1000) as u16,
        weekday: (days + 4).rem_euclid(7) as u8,
        offset_seconds,
        abbreviation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paris() -> TimeZone {
        zone("Europe/Paris").map(|z| z.tz).unwrap_or(TimeZone::UTC)
    }

    #[test]
    fn daylight_saving_continues_past_the_table() {
        // 2101-07-01T12:00Z: CEST (+2) by the EU rule; 2101-01-01: CET (+1).
        assert_eq!(local(&paris(), 4_149_662_400_000).offset_seconds, 7200);
        assert_eq!(local(&paris(), 4_133_980_800_000).offset_seconds, 3600);
        // Far beyond jiff's range the rule still applies (year 12101).
        let far = 4_149_662_400_000 + 25 * CYCLE_MS;
        let l = local(&paris(), far);
        assert_eq!((l.year, l.month, l.offset_seconds), (12101, 7, 7200));
    }

    #[test]
    fn year_zero_and_bc_years() {
        let utc = TimeZone::UTC;
        // 0000-06-01T00:00:00Z and -000044-03-15T00:00:00Z (as node's Date parses them).
        let y0 = local(&utc, -62_154_086_400_000);
        assert_eq!((y0.year, y0.month, y0.day, y0.weekday), (0, 6, 1, 4));
        let bc = local(&utc, -63_549_360_000_000);
        assert_eq!((bc.year, bc.month, bc.day, bc.weekday), (-44, 3, 15, 4));
    }

    #[test]
    fn names_are_case_insensitive_and_unknown_ones_refused() {
        assert_eq!(
            zone("asia/seoul").map(|z| z.name),
            Some("Asia/Seoul".into())
        );
        assert_eq!(zone("utc").map(|z| z.name), Some("UTC".into()));
        assert!(zone("Mars/Base").is_none());
    }
}
