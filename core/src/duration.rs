//! Durations as people write them (`90s`, `30m`, `4h`): parsing with a sane upper bound, the
//! serde adapter the config file and policy rules use, and rendering for people (`human`). A
//! leaf module: it imports nothing from this crate, so every other module can use it.

use std::time::Duration;

/// The longest duration any setting accepts. Far beyond any sensible threshold, and small enough
/// that adding it to a timestamp can never overflow (`--idle-after 400000y` used to panic).
pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses `90s`, `30m`, `4h`, `1h30m`; at most one year.
pub fn parse(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (write durations like 90s, 30m, 4h)"))?;
    if d > MAX {
        return Err(format!("{} is longer than a year: write a shorter duration, like 30m or 8h", s.trim()));
    }
    Ok(d)
}

/// Converts for timestamp arithmetic; every configured duration is at most `MAX`, so this
/// saturates only for values that no setting can produce.
pub fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d.min(MAX)).unwrap_or(chrono::Duration::MAX)
}

/// Renders a duration for people: `45s`, `12m`, `2h05m`, `3d4h`.
pub fn human(d: chrono::Duration) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `serde(with)` for optional durations written as strings (`"30m"`).
pub mod opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| super::parse(&s).map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration: {e}")))).transpose()
    }

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_bounds() {
        assert_eq!(parse(" 90s ").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse("400000y").unwrap_err().contains("longer than a year"));
        assert!(parse("soon").unwrap_err().contains("write durations like"));
        assert_eq!(chrono(Duration::MAX), chrono(MAX));
    }

    #[test]
    fn renders_for_people() {
        let h = |s| human(chrono::Duration::seconds(s));
        assert_eq!([h(45), h(720), h(7500), h(273_600), h(-5)], ["45s", "12m", "2h05m", "3d4h", "0s"]);
    }
}
