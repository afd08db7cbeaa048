//! Time: a UTC instant with microsecond precision.
//!
//! Every record and event carries one. It serializes as an RFC 3339 string in UTC
//! (`2026-11-21T21:24:17.123456Z`); each wire vocabulary renders it its own way
//! through [`Timestamp::unix_seconds`], [`Timestamp::unix_millis`] or [`Timestamp::to_rfc3339`].

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest a timeout waits: longer ones (up to `Duration::MAX`) overflow the clocks
/// they are added to, so they wait this long, a century, instead.
pub const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A UTC instant, microseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

/// A string that is not an RFC 3339 timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid timestamp {value:?}: expected RFC 3339, such as 2026-11-21T21:24:17Z")]
pub struct InvalidTimestamp {
    /// The rejected input.
    pub value: String,
}

impl Timestamp {
    /// The current time.
    #[must_use]
    pub fn now() -> Self {
        let micros = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_micros()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX),
        };
        Self::from_unix_micros(micros)
    }

    /// The instant `micros` microseconds after the Unix epoch, brought within
    /// [`Timestamp::MIN`]..=[`Timestamp::MAX`]: every timestamp serializes as a string
    /// that parses back, so a record stored with one can be read again.
    #[must_use]
    pub const fn from_unix_micros(micros: i64) -> Self {
        if micros > Self::MAX.0 {
            Self::MAX
        } else if micros < Self::MIN.0 {
            Self::MIN
        } else {
            Self(micros)
        }
    }

    /// The instant `millis` milliseconds after the Unix epoch, within the same range.
    #[must_use]
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self::from_unix_micros(millis.saturating_mul(1000))
    }

    /// Microseconds since the Unix epoch.
    #[must_use]
    pub const fn unix_micros(self) -> i64 {
        self.0
    }

    /// Milliseconds since the Unix epoch (AG-UI and agent-team events use these).
    #[must_use]
    pub const fn unix_millis(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// Whole seconds since the Unix epoch (Agno uses these).
    #[must_use]
    pub const fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }

    /// The latest instant RFC 3339 can write: `9999-12-31T23:59:59.999999Z`.
    pub const MAX: Self = Self(253_402_300_799_999_999);

    /// The earliest instant RFC 3339 can write: `0000-01-01T00:00:00Z`.
    pub const MIN: Self = Self(-62_167_219_200_000_000);

    /// This instant plus a duration, saturating at [`Timestamp::MAX`] (so that what is
    /// written can be read back).
    #[must_use]
    pub fn saturating_add(self, duration: Duration) -> Self {
        let sum = self.0.saturating_add(i64::try_from(duration.as_micros()).unwrap_or(i64::MAX));
        Self(sum.min(Self::MAX.0).max(self.0))
    }

    /// The RFC 3339 form in UTC with six fractional digits, such as
    /// `2026-11-21T21:24:17.123456Z`.
    #[must_use]
    pub fn to_rfc3339(self) -> String {
        let mut out = String::with_capacity(27);
        self.write_rfc3339(&mut out);
        out
    }

    fn write_rfc3339(self, out: &mut String) {
        let fields = self.fields();
        match fields.text() {
            Some(text) => out.push_str(Rfc3339::as_str(&text)),
            None => {
                let Rfc3339 { year, month, day, hour, minute, second, micros } = fields;
                use std::fmt::Write as _;
                // Writing to a String cannot fail.
                let _ = write!(
                    out,
                    "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{micros:06}Z"
                );
            }
        }
    }

    fn fields(self) -> Rfc3339 {
        let secs = self.0.div_euclid(1_000_000);
        let days = secs.div_euclid(86_400);
        let secs_of_day = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Rfc3339 {
            year,
            month,
            day,
            hour: secs_of_day / 3600,
            minute: (secs_of_day / 60) % 60,
            second: secs_of_day % 60,
            micros: self.0.rem_euclid(1_000_000),
        }
    }
}

/// The parts of a timestamp's RFC 3339 form.
struct Rfc3339 {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
    micros: i64,
}

impl Rfc3339 {
    /// The form written digit by digit, for years 0 to 9999 (timestamps are written on
    /// every event; the formatting machinery costs several times more).
    fn text(&self) -> Option<[u8; 27]> {
        fn put(out: &mut [u8; 27], end: usize, width: usize, value: i64) {
            let mut value = value.unsigned_abs();
            for slot in out[end - width..end].iter_mut().rev() {
                // A digit: `value % 10` is below 10.
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        if !(0..=9999).contains(&self.year) {
            return None;
        }
        let mut out = *b"0000-00-00T00:00:00.000000Z";
        put(&mut out, 4, 4, self.year);
        put(&mut out, 7, 2, i64::from(self.month));
        put(&mut out, 10, 2, i64::from(self.day));
        put(&mut out, 13, 2, self.hour);
        put(&mut out, 16, 2, self.minute);
        put(&mut out, 19, 2, self.second);
        put(&mut out, 26, 6, self.micros);
        Some(out)
    }

    /// The text of [`Rfc3339::text`] (ASCII digits and separators).
    fn as_str(text: &[u8; 27]) -> &str {
        std::str::from_utf8(text).unwrap_or("")
    }
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both values are in range by construction (1..=31 and 1..=12).
    (year, u32::try_from(month).unwrap_or(1), u32::try_from(day).unwrap_or(1))
}

impl FromStr for Timestamp {
    type Err = InvalidTimestamp;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map_err(|_| InvalidTimestamp { value: s.to_owned() })?;
        let micros = parsed.unix_timestamp_nanos().div_euclid(1000);
        // An offset can carry a date at either end of the years past them (`9999-12-31T23:59:59-01:00`
        // is in year 10000), which could not be written back.
        i64::try_from(micros)
            .ok()
            .filter(|micros| (Self::MIN.0..=Self::MAX.0).contains(micros))
            .map(Self)
            .ok_or_else(|| InvalidTimestamp { value: s.to_owned() })
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::fixed_text::serialize_fixed(serializer, &TimestampText(*self))
    }
}

/// A timestamp's text, formatted only when a serializer asks for it (see `fixed_text`).
struct TimestampText(Timestamp);

impl Serialize for TimestampText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.fields().text() {
            Some(text) => serializer.serialize_str(Rfc3339::as_str(&text)),
            None => serializer.serialize_str(&self.0.to_rfc3339()),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(crate::ids::ParseVisitor::<Self>::new("RFC 3339 timestamp"))
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "date-time" })
    }
}
