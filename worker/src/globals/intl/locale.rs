//! Locale negotiation (ECMA-402 LookupMatcher over ICU4X's compiled data).
//!
//! A requested locale is available when ICU4X's data resolves it to something other than the
//! root locale (see `available`). The locale reported back (`resolvedOptions().locale`) is the
//! requested tag when the data found is the data of that tag (its own, a regional parent such
//! as en-001 for en-GB, or a parent that means the same after adding likely subtags: `ko-KR`
//! is `ko`), else the locale whose data was found (`de-XX` reports `de`). Nothing available:
//! the default, `en-US`. A regional variant whose data ICU4X folds into its language (a
//! region without its own patterns) is reported as the language.

use icu::locale::{LanguageIdentifier, Locale, LocaleExpander};
use icu_provider::prelude::*;

/// The locale every service falls back to when none requested is available.
pub(crate) const DEFAULT: &str = "en-US";

/// A requested tag that does not parse: ECMA-402's RangeError.
pub(crate) struct BadTag(pub(crate) String);

/// Parses a requested BCP 47 tag (case-normalised by the parser).
pub(crate) fn parse(tag: &str) -> Result<Locale, BadTag> {
    Locale::try_from_str(tag)
        .map_err(|_| BadTag(format!("Incorrect locale information provided: {tag}")))
}

fn maximized(id: &LanguageIdentifier) -> LanguageIdentifier {
    let mut m = id.clone();
    LocaleExpander::new_common().maximize(&mut m);
    m
}

/// The locale whose data a lookup of `M` (with marker attributes `attr`) for `id` finds: `id`
/// itself when it has data of its own, else the ancestor that has; None when only the root does.
fn probe<M>(id: &LanguageIdentifier, attr: &str) -> Option<LanguageIdentifier>
where
    M: DataMarker,
    icu::datetime::provider::Baked: DataProvider<M>,
{
    let dl = DataLocale::from(id);
    let mut metadata = DataRequestMetadata::default();
    metadata.silent = true;
    let req = DataRequest {
        id: DataIdentifierBorrowed::for_marker_attributes_and_locale(
            DataMarkerAttributes::try_from_str(attr).ok()?,
            &dl,
        ),
        metadata,
    };
    let resp = icu::datetime::provider::Baked.load(req).ok()?;
    match resp.metadata.locale {
        None => Some(id.clone()),
        Some(found) if found.is_unknown() => None,
        Some(found) => Some(found.into_locale().id),
    }
}

/// The language identifier whose data serves `id`, as reported; None when only root data
/// would serve it. Two probes: weekday names (every CLDR language has its own) and Gregorian
/// date patterns (regional variants such as en-GB and fr-CA have their own).
fn available(id: &LanguageIdentifier) -> Option<LanguageIdentifier> {
    use icu::datetime::provider::names::DatetimeNamesWeekdayV1;
    use icu::datetime::provider::semantic_skeletons::DatetimePatternsDateGregorianV1;
    // Wide weekday names ("5") and the year-month-day patterns ("ym0d").
    let language = probe::<DatetimeNamesWeekdayV1>(id, "5")?;
    let found = match probe::<DatetimePatternsDateGregorianV1>(id, "ym0d") {
        Some(p) if p.region.is_some() || p.script.is_some() => p,
        _ => language,
    };
    // The request's own data, a regional parent it inherits from (en-GB from en-001, es-MX
    // from es-419), or a parent that means the same (ko-KR is ko): the request is what is used.
    if found == *id || found.region.is_some() || maximized(&found) == maximized(id) {
        Some(id.clone())
    } else {
        Some(found)
    }
}

/// The first requested locale that is available (with the requested Unicode extension
/// keywords kept, for the service to pick what it supports), or the default.
pub(crate) fn resolve(requested: &[String]) -> Result<Locale, BadTag> {
    for tag in requested {
        let loc = parse(tag)?;
        if let Some(id) = available(&loc.id) {
            let mut out = Locale::from(id);
            out.extensions.unicode = loc.extensions.unicode.clone();
            return Ok(out);
        }
    }
    parse(DEFAULT)
}

/// `supportedLocalesOf`: the requested tags that are available, as requested.
pub(crate) fn supported(requested: &[String]) -> Result<Vec<String>, BadTag> {
    let mut out = Vec::new();
    for tag in requested {
        let loc = parse(tag)?;
        if available(&loc.id).is_some() {
            out.push(loc.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(tag: &str) -> String {
        resolve(&[tag.to_string()])
            .map(|l| l.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn fallback_reports_the_data_used() {
        assert_eq!(r("de"), "de");
        assert_eq!(r("ko-KR"), "ko-KR");
        assert_eq!(r("de-XX"), "de");
        assert_eq!(r("en-GB"), "en-GB");
        assert_eq!(r("xx"), "en-US");
        assert!(resolve(&["not a tag".into()]).is_err());
    }
}
