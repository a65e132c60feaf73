//! Intl on ICU4X, with CLDR data compiled into the binary (nothing is read at run time). This
//! is the Rust half of `intl.js`: the JavaScript side resolves ECMA-402 options and shapes the
//! objects; the functions here negotiate locales and format with ICU4X.
//!
//! The host object is made only when a tool first touches Intl (or a locale-sensitive method),
//! and each formatter is built on first use and kept in a small per-process cache keyed by its
//! resolved locale and options, so a pre-warmed worker pays for nothing until a tool asks.

mod datetime;
mod locale;
mod number;
mod parts;
mod text;
mod zone;

use parts::Piece;
use rquickjs::{Ctx, Exception, Function, Object};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

enum Service {
    Number(number::NumberFormatter),
    DateTime(datetime::DateTimeFormatter),
    DateRange(datetime::DateRangeFormatter),
    Collator(icu::collator::CollatorBorrowed<'static>),
    Plural(icu::plurals::PluralRules),
    List(icu::list::ListFormatter),
    Relative(icu::experimental::relativetime::RelativeTimeFormatter),
}

/// Distinct formatters kept at once; past it the cache starts over (a tool that builds
/// formatters for thousands of option sets rebuilds them, it does not grow memory).
const CACHE_CAP: usize = 64;

thread_local! {
    static CACHE: RefCell<HashMap<String, Rc<Service>>> = RefCell::new(HashMap::new());
}

/// The formatter for (`kind`, `locale`, `options`), built by `build` on a cache miss.
fn service(
    kind: &str,
    locale: &str,
    options: &str,
    build: impl FnOnce(&icu::locale::Locale, &Value) -> Result<Service, String>,
) -> Result<Rc<Service>, String> {
    let key = format!("{kind}\u{0}{locale}\u{0}{options}");
    if let Some(s) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(s);
    }
    let loc = locale::parse(locale).map_err(|e| e.0)?;
    let opts: Value = serde_json::from_str(options).map_err(|e| format!("options: {e}"))?;
    let s = Rc::new(build(&loc, &opts)?);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHE_CAP {
            c.clear();
        }
        c.insert(key, s.clone());
    });
    Ok(s)
}

fn range<'js>(ctx: &Ctx<'js>) -> impl Fn(String) -> rquickjs::Error + 'js {
    let ctx = ctx.clone();
    move |m| Exception::throw_range(&ctx, &m)
}

fn pieces(p: Vec<Piece>) -> Vec<Vec<String>> {
    p.into_iter().map(|(k, v)| vec![k, v]).collect()
}

fn wrong_kind(ctx: &Ctx<'_>) -> rquickjs::Error {
    Exception::throw_internal(ctx, "intl: formatter kind mismatch")
}

/// Epoch milliseconds as ECMA-402 takes them (TimeClip): finite, within ±8.64e15.
fn time_value(ctx: &Ctx<'_>, ms: f64) -> rquickjs::Result<i64> {
    if !ms.is_finite() || ms.abs() > 8.64e15 {
        return Err(Exception::throw_range(ctx, "Invalid time value"));
    }
    Ok(ms.trunc() as i64)
}

/// The JavaScript half: `intl.js` (namespace, helpers, locale methods) and one file per class.
pub(crate) const CORE_JS: &str = include_str!("../intl.js");
pub(crate) fn class_js(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "intl-datetime" => (include_str!("datetime.js"), "stsd-intl-datetime.js"),
        "intl-number" => (include_str!("number.js"), "stsd-intl-number.js"),
        "intl-collator" => (include_str!("collator.js"), "stsd-intl-collator.js"),
        "intl-plural" => (include_str!("plural.js"), "stsd-intl-plural.js"),
        "intl-list" => (include_str!("list.js"), "stsd-intl-list.js"),
        "intl-relative" => (include_str!("relative.js"), "stsd-intl-relative.js"),
        "intl-segmenter" => (include_str!("segmenter.js"), "stsd-intl-segmenter.js"),
        _ => return None,
    })
}

/// The functions `intl.js` receives.
pub(crate) fn host_object<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    o.set(
        "resolve",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, requested: Vec<String>| {
            let loc = locale::resolve(&requested).map_err(|e| range(&ctx)(e.0))?;
            let out = Object::new(ctx.clone())?;
            out.set("locale", loc.id.to_string())?;
            let ext = Object::new(ctx.clone())?;
            for (k, v) in loc.extensions.unicode.keywords.iter() {
                ext.set(
                    k.as_str(),
                    if v.is_empty() {
                        "true".to_string()
                    } else {
                        v.to_string()
                    },
                )?;
            }
            out.set("ext", ext)?;
            Ok::<_, rquickjs::Error>(out)
        })?,
    )?;
    o.set(
        "supported",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, requested: Vec<String>| {
            locale::supported(&requested).map_err(|e| range(&ctx)(e.0))
        })?,
    )?;
    o.set(
        "canonical",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, requested: Vec<String>| {
            requested
                .iter()
                .map(|t| locale::parse(t).map(|l| l.to_string()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| range(&ctx)(e.0))
        })?,
    )?;
    o.set(
        "zone",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, name: String| {
            zone::zone(&name)
                .map(|z| z.name)
                .ok_or_else(|| range(&ctx)(format!("Invalid time zone specified: {name}")))
        })?,
    )?;
    o.set(
        "tzFields",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, ms: f64, name: String| {
            let ms = time_value(&ctx, ms)?;
            let z = zone::zone(&name)
                .ok_or_else(|| range(&ctx)(format!("Invalid time zone specified: {name}")))?;
            let l = zone::local(&z.tz, ms);
            let o = Object::new(ctx.clone())?;
            o.set("year", l.year as f64)?;
            o.set("month", l.month)?;
            o.set("day", l.day)?;
            o.set("hour", l.hour)?;
            o.set("minute", l.minute)?;
            o.set("second", l.second)?;
            o.set("millisecond", l.millisecond)?;
            o.set("weekday", l.weekday)?;
            o.set("offsetSeconds", l.offset_seconds)?;
            o.set("abbreviation", l.abbreviation)?;
            Ok::<_, rquickjs::Error>(o)
        })?,
    )?;
    o.set(
        "number",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, v: f64| {
                let s = service("number", &loc, &opts, |l, o| {
                    number::NumberFormatter::new(l, o).map(Service::Number)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::Number(f) => Ok(pieces(f.format(v))),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "dateTime",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, ms: f64| {
                let ms = time_value(&ctx, ms)?;
                let s = service("dt", &loc, &opts, |l, o| {
                    datetime::DateTimeFormatter::new(l, o).map(Service::DateTime)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::DateTime(f) => f.format(ms).map(pieces).map_err(range(&ctx)),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "dateTimeRange",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, a: f64, b: f64| {
                let (a, b) = (time_value(&ctx, a)?, time_value(&ctx, b)?);
                let s = service("dtr", &loc, &opts, |l, o| {
                    datetime::DateRangeFormatter::new(l, o).map(Service::DateRange)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::DateRange(f) => f
                        .format(a, b)
                        .map(|p| {
                            p.into_iter()
                                .map(|(k, v, s)| vec![k, v, s])
                                .collect::<Vec<_>>()
                        })
                        .map_err(range(&ctx)),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "dateTimeInfo",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, loc: String, opts: String| {
            let s = service("dt", &loc, &opts, |l, o| {
                datetime::DateTimeFormatter::new(l, o).map(Service::DateTime)
            })
            .map_err(range(&ctx))?;
            let Service::DateTime(f) = &*s else {
                return Err(wrong_kind(&ctx));
            };
            let out = Object::new(ctx.clone())?;
            out.set("timeZone", f.zone_name())?;
            out.set("hourCycle", f.hour_cycle())?;
            Ok(out)
        })?,
    )?;
    o.set(
        "compare",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, a: String, b: String| {
                let s = service("coll", &loc, &opts, |l, o| {
                    text::collator(l, o).map(Service::Collator)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::Collator(c) => Ok(text::compare(c, &a, &b)),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "plural",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, n: f64, min: i32, max: i32| {
                let s = service("plural", &loc, &opts, |l, o| {
                    text::plural_rules(l, o).map(Service::Plural)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::Plural(p) => Ok(text::plural_select(
                        p,
                        n,
                        min.clamp(0, 100) as i16,
                        max.clamp(0, 100) as i16,
                    )),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "pluralCategories",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, loc: String, opts: String| {
            let s = service("plural", &loc, &opts, |l, o| {
                text::plural_rules(l, o).map(Service::Plural)
            })
            .map_err(range(&ctx))?;
            match &*s {
                Service::Plural(p) => {
                    Ok(p.categories().map(text::category_name).collect::<Vec<_>>())
                }
                _ => Err(wrong_kind(&ctx)),
            }
        })?,
    )?;
    o.set(
        "list",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, items: Vec<String>| {
                let s = service("list", &loc, &opts, |l, o| {
                    text::list_formatter(l, o).map(Service::List)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::List(f) => Ok(pieces(text::list_format(f, &items))),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "relative",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, opts: String, v: f64, unit: String| {
                let kind = format!("rel-{unit}");
                let s = service(&kind, &loc, &opts, |l, o| {
                    text::relative_time(l, o, &unit).map(Service::Relative)
                })
                .map_err(range(&ctx))?;
                match &*s {
                    Service::Relative(f) => Ok(pieces(text::relative_format(f, v))),
                    _ => Err(wrong_kind(&ctx)),
                }
            },
        )?,
    )?;
    o.set(
        "segment",
        Function::new(ctx.clone(), |granularity: String, input: String| {
            text::segment(&granularity, &input)
                .into_iter()
                .flat_map(|(a, b, w)| [a, b, u32::from(w)])
                .collect::<Vec<u32>>()
        })?,
    )?;
    o.set(
        "caseMap",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, loc: String, input: String, upper: bool| {
                let l = locale::parse(&loc).map_err(|e| range(&ctx)(e.0))?;
                Ok::<_, rquickjs::Error>(text::case_map(&l, &input, upper))
            },
        )?,
    )?;
    Ok(o)
}
