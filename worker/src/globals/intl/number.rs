//! Intl.NumberFormat (and Number#toLocaleString): ICU4X's decimal, percent, currency and compact
//! formatters. The JavaScript side resolves the options (ECMA-402 defaults and range checks);
//! this side rounds the value as they say (half-expand, as ECMA-402) and formats it.

use super::parts::{collect, Piece};
use fixed_decimal::{
    Decimal, FloatPrecision, SignDisplay, SignedRoundingMode, UnsignedRoundingMode,
};
use icu::decimal::options::{DecimalFormatterOptions, GroupingStrategy};
use icu::decimal::{CompactDecimalFormatter, DecimalFormatter};
use icu::experimental::dimension::currency::formatter::CurrencyFormatter;
use icu::experimental::dimension::currency::CurrencyType;
use icu::experimental::dimension::percent::formatter::PercentFormatter;
use icu::locale::Locale;
use serde_json::Value;

pub(crate) enum NumberFormatter {
    Decimal(DecimalFormatter, Rounding),
    Percent(PercentFormatter<DecimalFormatter>, Rounding),
    Currency(CurrencyFormatter<DecimalFormatter>, Rounding),
    Compact(CompactDecimalFormatter, SignDisplay),
}

/// How a value is rounded and padded before it is formatted.
pub(crate) struct Rounding {
    min_int: i16,
    min_frac: i16,
    max_frac: i16,
    sign: SignDisplay,
}

fn num(o: &Value, k: &str, default: i64) -> i16 {
    o.get(k)
        .and_then(Value::as_i64)
        .unwrap_or(default)
        .clamp(0, 100) as i16
}

fn text<'a>(o: &'a Value, k: &str) -> &'a str {
    o.get(k).and_then(Value::as_str).unwrap_or("")
}

impl NumberFormatter {
    /// Builds the formatter for resolved options `o` (see intl.js `NumberFormat`).
    pub(crate) fn new(locale: &Locale, o: &Value) -> Result<Self, String> {
        let grouping = match o.get("useGrouping") {
            Some(Value::Bool(false)) => GroupingStrategy::Never,
            Some(Value::String(s)) if s == "always" => GroupingStrategy::Always,
            Some(Value::String(s)) if s == "min2" => GroupingStrategy::Min2,
            _ => GroupingStrategy::Auto,
        };
        let sign = match text(o, "signDisplay") {
            "never" => SignDisplay::Never,
            "always" => SignDisplay::Always,
            "exceptZero" => SignDisplay::ExceptZero,
            "negative" => SignDisplay::Negative,
            _ => SignDisplay::Auto,
        };
        let rounding = Rounding {
            min_int: num(o, "minimumIntegerDigits", 1),
            min_frac: num(o, "minimumFractionDigits", 0),
            max_frac: num(o, "maximumFractionDigits", 3),
            sign,
        };
        let mut dopts = DecimalFormatterOptions::default();
        dopts.grouping_strategy = Some(grouping);
        let err = |e: icu_provider::DataError| e.to_string();
        let prefs = locale.into();
        let decimal = || DecimalFormatter::try_new(prefs, dopts).map_err(err);
        if text(o, "notation") == "compact" {
            let copts = dopts.into();
            let f = if text(o, "compactDisplay") == "long" {
                CompactDecimalFormatter::try_new_long(locale.into(), copts)
            } else {
                CompactDecimalFormatter::try_new_short(locale.into(), copts)
            };
            return Ok(Self::Compact(f.map_err(err)?, sign));
        }
        Ok(match text(o, "style") {
            "percent" => Self::Percent(
                PercentFormatter::try_new_with_decimal_formatter(
                    locale.into(),
                    decimal()?,
                    Default::default(),
                )
                .map_err(err)?,
                rounding,
            ),
            "currency" => {
                let code = CurrencyType::try_from_str(&text(o, "currency").to_ascii_lowercase())
                    .map_err(|_| format!("Invalid currency code : {}", text(o, "currency")))?;
                let f = match text(o, "currencyDisplay") {
                    "code" => {
                        CurrencyFormatter::try_new_code(locale.into(), code, Default::default())
                    }
                    "name" => CurrencyFormatter::try_new_name(locale.into(), code),
                    "narrowSymbol" => CurrencyFormatter::try_new_symbol_narrow(
                        locale.into(),
                        code,
                        Default::default(),
                    ),
                    _ => CurrencyFormatter::try_new_symbol(locale.into(), code, Default::default()),
                };
                Self::Currency(f.map_err(err)?, rounding)
            }
            _ => Self::Decimal(decimal()?, rounding),
        })
    }

    /// The parts of `value` formatted. NaN and the infinities are ICU's symbols (`NaN`, `∞`).
    pub(crate) fn format(&self, value: f64) -> Vec<Piece> {
        if !value.is_finite() {
            return special(value, self.sign());
        }
        let Ok(mut d) = Decimal::try_from_f64(value, FloatPrecision::RoundTrip) else {
            return special(f64::NAN, self.sign());
        };
        match self {
            Self::Decimal(f, r) => collect(&f.format(&r.apply(d))),
            Self::Percent(f, r) => {
                d.multiply_pow10(2);
                let d = r.apply(d);
                collect(&f.format(&d))
            }
            Self::Currency(f, r) => collect(&f.format_fixed_decimal(&r.apply(d))),
            Self::Compact(f, sign) => {
                d.apply_sign_display(*sign);
                collect(&f.format(&d))
            }
        }
    }

    fn sign(&self) -> SignDisplay {
        match self {
            Self::Decimal(_, r) | Self::Percent(_, r) | Self::Currency(_, r) => r.sign,
            Self::Compact(_, s) => *s,
        }
    }
}

impl Rounding {
    fn apply(&self, mut d: Decimal) -> Decimal {
        d.round_with_mode(
            -self.max_frac,
            SignedRoundingMode::Unsigned(UnsignedRoundingMode::HalfExpand),
        );
        d.absolute.trim_end();
        d.absolute.pad_end(-self.min_frac);
        d.absolute.pad_start(self.min_int);
        d.apply_sign_display(self.sign);
        d
    }
}

/// NaN and ±∞, which ICU4X's decimal type cannot hold, with the sign display applied.
fn special(value: f64, sign: SignDisplay) -> Vec<Piece> {
    let mut out = Vec::new();
    let negative = value.is_sign_negative() && !value.is_nan();
    let show = match sign {
        SignDisplay::Never => None,
        SignDisplay::Always => Some(if negative { "-" } else { "+" }),
        SignDisplay::ExceptZero if !value.is_nan() => Some(if negative { "-" } else { "+" }),
        _ if negative => Some("-"),
        _ => None,
    };
    if let Some(s) = show {
        out.push((
            if s == "-" { "minusSign" } else { "plusSign" }.into(),
            s.into(),
        ));
    }
    if value.is_nan() {
        out.push(("nan".into(), "NaN".into()));
    } else {
        out.push(("infinity".into(), "∞".into()));
    }
    out
}
