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
        Self(micros)
    }

    /// The instant `micros` microseconds after the Unix epoch.
    #[must_use]
    pub const fn from_unix_micros(micros: i64) -> Self {
        Self(micros)
    }

    /// The instant `millis` milliseconds after the Unix epoch.
    #[must_use]
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis.saturating_mul(1000))
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

    /// This instant plus a duration, saturating.
    #[must_use]
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)))
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
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        let days = secs.div_euclid(86_400);
        let secs_of_day = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let (hour, minute, second) = (secs_of_day / 3600, (secs_of_day / 60) % 60, secs_of_day % 60);
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = write!(out, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{micros:06}Z");
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
        i64::try_from(micros).map(Self).map_err(|_| InvalidTimestamp { value: s.to_owned() })
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
        let mut buf = String::with_capacity(27);
        self.write_rfc3339(&mut buf);
        serializer.serialize_str(&buf)
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
