//! The text services of Intl on ICU4X: Collator (and localeCompare), PluralRules, ListFormat,
//! RelativeTimeFormat, Segmenter and locale-aware case mapping.

use super::parts::{collect, Piece};
use fixed_decimal::{Decimal, FloatPrecision, SignedRoundingMode, UnsignedRoundingMode};
use icu::collator::options::{AlternateHandling, CaseLevel, CollatorOptions, Strength};
use icu::collator::preferences::{CollationCaseFirst, CollationNumericOrdering};
use icu::collator::{CollatorBorrowed, CollatorPreferences};
use icu::experimental::relativetime::options::Numeric;
use icu::experimental::relativetime::{RelativeTimeFormatter, RelativeTimeFormatterOptions};
use icu::list::options::{ListFormatterOptions, ListLength};
use icu::list::ListFormatter;
use icu::locale::Locale;
use icu::plurals::{PluralCategory, PluralRuleType, PluralRules, PluralRulesOptions};
use serde_json::Value;
use std::cmp::Ordering;

fn text<'a>(o: &'a Value, k: &str) -> &'a str {
    o.get(k).and_then(Value::as_str).unwrap_or("")
}

fn err(e: icu_provider::DataError) -> String {
    e.to_string()
}

/// Intl.Collator: `sensitivity` maps to strength (base: primary, accent: secondary, case:
/// primary plus the case level, variant: tertiary), `numeric` and `caseFirst` to the -u-kn and
/// -u-kf preferences, `ignorePunctuation` to shifted alternate handling.
pub(crate) fn collator(locale: &Locale, o: &Value) -> Result<CollatorBorrowed<'static>, String> {
    let mut prefs = CollatorPreferences::from(locale);
    prefs.numeric_ordering = Some(if o.get("numeric") == Some(&Value::Bool(true)) {
        CollationNumericOrdering::True
    } else {
        CollationNumericOrdering::False
    });
    prefs.case_first = match text(o, "caseFirst") {
        "upper" => Some(CollationCaseFirst::Upper),
        "lower" => Some(CollationCaseFirst::Lower),
        _ => None,
    };
    let mut opts = CollatorOptions::default();
    opts.strength = Some(match text(o, "sensitivity") {
        "base" | "case" => Strength::Primary,
        "accent" => Strength::Secondary,
        _ => Strength::Tertiary,
    });
    if text(o, "sensitivity") == "case" {
        opts.case_level = Some(CaseLevel::On);
    }
    if o.get("ignorePunctuation") == Some(&Value::Bool(true)) {
        opts.alternate_handling = Some(AlternateHandling::Shifted);
    }
    CollatorBorrowed::try_new(prefs, opts).map_err(err)
}

pub(crate) fn compare(c: &CollatorBorrowed<'static>, a: &str, b: &str) -> i32 {
    match c.compare(a, b) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

/// Intl.PluralRules (cardinal or ordinal).
pub(crate) fn plural_rules(locale: &Locale, o: &Value) -> Result<PluralRules, String> {
    let kind = if text(o, "type") == "ordinal" {
        PluralRuleType::Ordinal
    } else {
        PluralRuleType::Cardinal
    };
    let mut opts = PluralRulesOptions::default();
    opts.rule_type = Some(kind);
    PluralRules::try_new(locale.into(), opts).map_err(err)
}

pub(crate) fn category_name(c: PluralCategory) -> &'static str {
    match c {
        PluralCategory::Zero => "zero",
        PluralCategory::One => "one",
        PluralCategory::Two => "two",
        PluralCategory::Few => "few",
        PluralCategory::Many => "many",
        PluralCategory::Other => "other",
    }
}

/// The category of `n` after ECMA-402's rounding (`min`..`max` fraction digits).
pub(crate) fn plural_select(p: &PluralRules, n: f64, min: i16, max: i16) -> &'static str {
    let Ok(mut d) = Decimal::try_from_f64(n.abs(), FloatPrecision::RoundTrip) else {
        return "other";
    };
    d.round_with_mode(
        -max,
        SignedRoundingMode::Unsigned(UnsignedRoundingMode::HalfExpand),
    );
    d.absolute.trim_end();
    d.absolute.pad_end(-min);
    category_name(p.category_for(&d))
}

/// Intl.ListFormat: `type` conjunction, disjunction or unit; `style` long, short or narrow.
pub(crate) fn list_formatter(locale: &Locale, o: &Value) -> Result<ListFormatter, String> {
    let length = match text(o, "style") {
        "short" => ListLength::Short,
        "narrow" => ListLength::Narrow,
        _ => ListLength::Wide,
    };
    let opts = ListFormatterOptions::default().with_length(length);
    match text(o, "type") {
        "disjunction" => ListFormatter::try_new_or(locale.into(), opts),
        "unit" => ListFormatter::try_new_unit(locale.into(), opts),
        _ => ListFormatter::try_new_and(locale.into(), opts),
    }
    .map_err(err)
}

pub(crate) fn list_format(f: &ListFormatter, items: &[String]) -> Vec<Piece> {
    collect(&f.format(items.iter().map(String::as_str)))
}

/// Intl.RelativeTimeFormat for one unit (ICU4X has a formatter per unit and width).
pub(crate) fn relative_time(
    locale: &Locale,
    o: &Value,
    unit: &str,
) -> Result<RelativeTimeFormatter, String> {
    let mut opts = RelativeTimeFormatterOptions::default();
    opts.numeric = if text(o, "numeric") == "auto" {
        Numeric::Auto
    } else {
        Numeric::Always
    };
    let p = locale.into();
    macro_rules! pick {
        ($($unit:literal => $long:ident, $short:ident, $narrow:ident;)*) => {
            match (unit, text(o, "style")) {
                $(
                    ($unit, "short") => RelativeTimeFormatter::$short(p, opts),
                    ($unit, "narrow") => RelativeTimeFormatter::$narrow(p, opts),
                    ($unit, _) => RelativeTimeFormatter::$long(p, opts),
                )*
                _ => return Err(format!("Invalid unit argument for format() '{unit}'")),
            }
        };
    }
    pick! {
        "second" => try_new_long_second, try_new_short_second, try_new_narrow_second;
        "minute" => try_new_long_minute, try_new_short_minute, try_new_narrow_minute;
        "hour" => try_new_long_hour, try_new_short_hour, try_new_narrow_hour;
        "day" => try_new_long_day, try_new_short_day, try_new_narrow_day;
        "week" => try_new_long_week, try_new_short_week, try_new_narrow_week;
        "month" => try_new_long_month, try_new_short_month, try_new_narrow_month;
        "quarter" => try_new_long_quarter, try_new_short_quarter, try_new_narrow_quarter;
        "year" => try_new_long_year, try_new_short_year, try_new_narrow_year;
    }
    .map_err(err)
}

pub(crate) fn relative_format(f: &RelativeTimeFormatter, value: f64) -> Vec<Piece> {
    match Decimal::try_from_f64(value, FloatPrecision::RoundTrip) {
        Ok(d) => collect(&f.format(d)),
        Err(_) => vec![("literal".into(), "NaN".into())],
    }
}

/// Intl.Segmenter: each segment as [start, end, isWordLike] in UTF-16 code units (JavaScript's
/// string indices). Word breaks use ICU4X's dictionaries for Chinese and Japanese.
pub(crate) fn segment(granularity: &str, input: &str) -> Vec<(u32, u32, bool)> {
    use icu::segmenter::options::{SentenceBreakInvariantOptions, WordBreakInvariantOptions};
    use icu::segmenter::{GraphemeClusterSegmenter, SentenceSegmenter, WordSegmenter};
    // Byte offset -> UTF-16 offset, for every char boundary.
    let mut utf16 = vec![0u32; input.len() + 1];
    let mut at = 0u32;
    for (i, c) in input.char_indices() {
        utf16[i] = at;
        at += c.len_utf16() as u32;
    }
    utf16[input.len()] = at;
    let mut out = Vec::new();
    let mut push = |a: usize, b: usize, w: bool| {
        if b > a {
            out.push((utf16[a], utf16[b], w));
        }
    };
    match granularity {
        "word" => {
            let mut it = WordSegmenter::new_dictionary(WordBreakInvariantOptions::default())
                .segment_str(input);
            let mut prev = 0;
            while let Some(b) = it.next() {
                push(prev, b, it.is_word_like());
                prev = b;
            }
        }
        "sentence" => {
            let bounds: Vec<usize> =
                SentenceSegmenter::new(SentenceBreakInvariantOptions::default())
                    .segment_str(input)
                    .collect();
            bounds.windows(2).for_each(|w| push(w[0], w[1], false));
        }
        _ => {
            let bounds: Vec<usize> = GraphemeClusterSegmenter::new().segment_str(input).collect();
            bounds.windows(2).for_each(|w| push(w[0], w[1], false));
        }
    }
    out
}

/// toLocaleUpperCase / toLocaleLowerCase: full case mapping with the language's tailoring
/// (Turkish and Azeri dotted i, Lithuanian, Greek upper-casing without accents).
pub(crate) fn case_map(locale: &Locale, s: &str, upper: bool) -> String {
    let cm = icu::casemap::CaseMapper::new();
    if upper {
        cm.uppercase_to_string(s, &locale.id).into_owned()
    } else {
        cm.lowercase_to_string(s, &locale.id).into_owned()
    }
}
