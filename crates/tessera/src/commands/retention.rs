//! Retention policies: which backups `forget` keeps, and the rule that kept
//! each one.
//!
//! The rules are restic's (docs/CLI.md, "forget", lists every difference):
//! backups are divided into groups (by host, paths and source by default:
//! [`crate::commands::forget::DEFAULT_GROUP_BY`]) and each group is walked from the
//! newest backup to the oldest.
//!
//! * `last N` keeps the N newest backups;
//! * `hourly`, `daily`, `weekly`, `monthly`, `yearly N` keep the newest
//!   backup of each of the N newest hours (days, ISO weeks, months, years)
//!   that have one, in the time zone given (the user's local time);
//! * when a calendar rule has fewer such periods than N, the oldest backup of
//!   the group is kept as well (restic ≥ 0.17);
//! * `within SPAN` keeps every backup made within SPAN (calendar arithmetic:
//!   `1y 6mo`, `30d`) before the group's newest backup;
//! * `tag T` keeps every backup carrying tag T.
//!
//! One difference from restic is deliberate: the newest backup of every group
//! is always kept, whatever the rules, unless `last 0` is given explicitly.
//! This module is pure (no repository access): it decides, [`crate::commands::forget`]
//! acts.

use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ZonedDateTime as Zoned};
use serde::Serialize;
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;

/// How many backups (or periods) a rule keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Count {
    /// At most this many.
    Limit(usize),
    /// No limit (`unlimited`).
    Unlimited,
}

impl Count {
    /// Whether the rule can keep one more.
    fn available(self) -> bool {
        !matches!(self, Count::Limit(0))
    }

    fn take(&mut self) {
        if let Count::Limit(n) = self {
            *n = n.saturating_sub(1);
        }
    }
}

impl std::str::FromStr for Count {
    type Err = Error;

    /// Parses `N` or `unlimited`.
    fn from_str(s: &str) -> Result<Count> {
        if s.eq_ignore_ascii_case("unlimited") {
            return Ok(Count::Unlimited);
        }
        s.parse().map(Count::Limit).map_err(|_| {
            Error::InvalidOption(format!(
                "{s:?} is not a count: give a number or `unlimited`"
            ))
        })
    }
}

/// A calendar period of the `--keep-hourly` … `--keep-yearly` rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// Calendar hours.
    Hourly,
    /// Calendar days.
    Daily,
    /// ISO 8601 weeks (Monday to Sunday).
    Weekly,
    /// Calendar months.
    Monthly,
    /// Calendar years.
    Yearly,
}

impl Period {
    /// Every period, shortest first.
    pub const ALL: [Period; 5] = [
        Period::Hourly,
        Period::Daily,
        Period::Weekly,
        Period::Monthly,
        Period::Yearly,
    ];

    /// The period of `time` this rule buckets by, as a comparable number.
    fn bucket(self, time: &Zoned) -> i64 {
        let (y, m, d, h) = (
            i64::from(time.year()),
            i64::from(time.month()),
            i64::from(time.day()),
            i64::from(time.hour()),
        );
        match self {
            Period::Hourly => ((y * 100 + m) * 100 + d) * 100 + h,
            Period::Daily => (y * 100 + m) * 100 + d,
            Period::Weekly => {
                let week = time.iso_week_date();
                i64::from(week.year()) * 100 + i64::from(week.week())
            }
            Period::Monthly => y * 100 + m,
            Period::Yearly => y,
        }
    }

    /// The option that sets this rule.
    pub fn option(self) -> &'static str {
        match self {
            Period::Hourly => "keep-hourly",
            Period::Daily => "keep-daily",
            Period::Weekly => "keep-weekly",
            Period::Monthly => "keep-monthly",
            Period::Yearly => "keep-yearly",
        }
    }
}

/// A retention policy: the union of its rules is kept.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// `--keep-last`.
    pub last: Option<Count>,
    /// `--keep-hourly` … `--keep-yearly`.
    pub periods: BTreeMap<Period, Count>,
    /// `--keep-within`.
    pub within: Option<Span>,
    /// `--keep-tag` (repeatable; a backup with any of them is kept).
    pub tags: Vec<String>,
}

impl Policy {
    /// Whether no rule is given (forget refuses: it would delete everything
    /// but the newest backup of each group, which is rarely what was meant).
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
            && self.periods.is_empty()
            && self.within.is_none()
            && self.tags.is_empty()
    }
}

/// One backup as retention sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The backup.
    pub id: BackupId,
    /// When it was made (seconds since the Unix epoch).
    pub time: i64,
    /// The group it belongs to (see [`crate::commands::forget::GroupKey`]).
    pub group: String,
    /// Its tags.
    pub tags: Vec<String>,
}

/// Why a backup is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum Reason {
    /// Among the `--keep-last` newest.
    Last,
    /// The newest backup of a period.
    Period {
        /// The rule.
        period: Period,
    },
    /// The oldest of a group with fewer periods than a rule asked for.
    Oldest {
        /// The rule that had room left.
        period: Period,
    },
    /// Within `--keep-within` of the group's newest backup.
    Within,
    /// Carries a `--keep-tag` tag.
    Tag {
        /// The tag.
        tag: String,
    },
    /// The newest backup of its group (always kept unless `--keep-last 0`).
    Newest,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Last => write!(f, "last"),
            Reason::Period { period } => write!(f, "{}", &period.option()[5..]),
            Reason::Oldest { period } => write!(f, "oldest ({} had room)", &period.option()[5..]),
            Reason::Within => write!(f, "within"),
            Reason::Tag { tag } => write!(f, "tag {tag}"),
            Reason::Newest => write!(f, "newest of group"),
        }
    }
}

/// The decision for one backup.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    /// The backup.
    pub id: BackupId,
    /// Its group.
    pub group: String,
    /// When it was made (seconds since the Unix epoch).
    pub time: i64,
    /// The rules that keep it; empty when it is removed.
    pub reasons: Vec<Reason>,
}

impl Decision {
    /// Whether the backup is kept.
    pub fn keep(&self) -> bool {
        !self.reasons.is_empty()
    }
}

/// Applies `policy` to `candidates`, with calendar periods in `tz`. Returns
/// one decision per candidate, grouped, each group newest first (groups in
/// name order).
pub fn decide(policy: &Policy, candidates: &[Candidate], tz: &TimeZone) -> Result<Vec<Decision>> {
    let mut groups: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for c in candidates {
        groups.entry(c.group.as_str()).or_default().push(c);
    }
    let mut out = Vec::with_capacity(candidates.len());
    for (group, mut list) in groups {
        list.sort_by_key(|c| std::cmp::Reverse((c.time, c.id)));
        out.extend(decide_group(policy, group, &list, tz)?);
    }
    Ok(out)
}

/// Applies `policy` to one group, `list` newest first.
fn decide_group(
    policy: &Policy,
    group: &str,
    list: &[&Candidate],
    tz: &TimeZone,
) -> Result<Vec<Decision>> {
    let zoned = |t: i64| -> Result<Zoned> {
        Timestamp::from_second(t)
            .map(|ts| ts.to_zoned_datetime(tz.clone()))
            .map_err(|e| Error::InvalidOption(format!("backup time {t}: {e}")))
    };
    let cutoff = match (policy.within, list.first()) {
        (Some(span), Some(newest)) => Some(
            zoned(newest.time)?
                .checked_sub(span)
                .map_err(|e| Error::InvalidOption(format!("--keep-within {span}: {e}")))?
                .timestamp()
                .as_second(),
        ),
        _ => None,
    };
    let mut last = policy.last;
    let mut periods: Vec<(Period, Count, Option<i64>)> =
        policy.periods.iter().map(|(&p, &c)| (p, c, None)).collect();
    let mut out = Vec::with_capacity(list.len());
    for (nr, c) in list.iter().enumerate() {
        let mut reasons = Vec::new();
        if nr == 0 && last != Some(Count::Limit(0)) {
            reasons.push(Reason::Newest);
        }
        if let Some(n) = last.as_mut() {
            if n.available() {
                n.take();
                reasons.push(Reason::Last);
            }
        }
        let time = zoned(c.time)?;
        for (period, count, seen) in periods.iter_mut() {
            let bucket = period.bucket(&time);
            if count.available() && *seen != Some(bucket) {
                count.take();
                *seen = Some(bucket);
                reasons.push(Reason::Period { period: *period });
            }
        }
        if cutoff.is_some_and(|cut| c.time >= cut) {
            reasons.push(Reason::Within);
        }
        for tag in &policy.tags {
            if c.tags.contains(tag) {
                reasons.push(Reason::Tag { tag: tag.clone() });
            }
        }
        out.push(Decision {
            id: c.id,
            group: group.to_string(),
            time: c.time,
            reasons,
        });
    }
    // A calendar rule with room left also keeps the group's oldest backup.
    if let Some(oldest) = out.last_mut() {
        for (period, count, _) in &periods {
            if matches!(count, Count::Limit(n) if *n > 0)
                && !oldest
                    .reasons
                    .iter()
                    .any(|r| matches!(r, Reason::Period { period: p } if p == period))
            {
                oldest.reasons.push(Reason::Oldest { period: *period });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(s: &str) -> i64 {
        s.parse::<Timestamp>().expect("test time").as_second()
    }

    fn cands(times: &[&str]) -> Vec<Candidate> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                id: i as BackupId + 1,
                time: at(t),
                group: "g".into(),
                tags: Vec::new(),
            })
            .collect()
    }

    fn kept(policy: &Policy, c: &[Candidate]) -> Vec<BackupId> {
        let mut ids: Vec<BackupId> = decide(policy, c, &TimeZone::UTC)
            .expect("decide")
            .into_iter()
            .filter(Decision::keep)
            .map(|d| d.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    fn periods(p: Period, n: usize) -> Policy {
        Policy {
            periods: [(p, Count::Limit(n))].into(),
            ..Policy::default()
        }
    }

    /// Two backups a day at 01:00 and 13:00 UTC from 2026-01-01 for `days` days.
    fn twice_daily(days: i64) -> Vec<Candidate> {
        let start = at("2026-01-01T01:00:00Z");
        (0..days * 2)
            .map(|i| Candidate {
                id: i as BackupId + 1,
                time: start + i * 12 * 3600,
                group: "g".into(),
                tags: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn keep_last_keeps_the_newest_n() {
        let c = twice_daily(3);
        let p = Policy {
            last: Some(Count::Limit(2)),
            ..Policy::default()
        };
        assert_eq!(kept(&p, &c), vec![5, 6]);
    }

    #[test]
    fn keep_last_zero_keeps_nothing() {
        let c = twice_daily(2);
        let p = Policy {
            last: Some(Count::Limit(0)),
            ..Policy::default()
        };
        assert!(kept(&p, &c).is_empty());
    }

    #[test]
    fn keep_daily_keeps_the_newest_of_each_day() {
        // 5 days; keep 3 days: the 13:00 backup of days 3, 4, 5.
        let c = twice_daily(5);
        assert_eq!(kept(&periods(Period::Daily, 3), &c), vec![6, 8, 10]);
    }

    #[test]
    fn keep_daily_uses_the_time_zone() {
        // 23:30 UTC on Jan 1 is Jan 2 in Tokyo: with two backups 23:30 and
        // 00:30 UTC, one day in Tokyo, two in UTC.
        let c = cands(&["2026-01-01T23:30:00Z", "2026-01-02T00:30:00Z"]);
        let tokyo = TimeZone::get("Asia/Tokyo").expect("tz database");
        let d = decide(&periods(Period::Daily, 5), &c, &tokyo).expect("decide");
        // Newest: newest + daily; oldest: same day, kept only because the rule had room.
        assert_eq!(
            d[0].reasons,
            vec![
                Reason::Newest,
                Reason::Period {
                    period: Period::Daily
                }
            ]
        );
        assert_eq!(
            d[1].reasons,
            vec![Reason::Oldest {
                period: Period::Daily
            }]
        );
        let utc = decide(&periods(Period::Daily, 5), &c, &TimeZone::UTC).expect("decide");
        assert_eq!(
            utc[1].reasons,
            vec![Reason::Period {
                period: Period::Daily
            }]
        );
    }

    #[test]
    fn keep_hourly_keeps_the_newest_of_each_hour() {
        let c = cands(&[
            "2026-03-01T10:05:00Z",
            "2026-03-01T10:55:00Z",
            "2026-03-01T11:10:00Z",
            "2026-03-01T12:00:00Z",
        ]);
        assert_eq!(kept(&periods(Period::Hourly, 2), &c), vec![3, 4]);
    }

    #[test]
    fn keep_weekly_uses_iso_weeks() {
        // 2026-01-04 is a Sunday (ISO week 1), 2026-01-05 a Monday (week 2).
        let c = cands(&[
            "2026-01-03T12:00:00Z",
            "2026-01-04T12:00:00Z",
            "2026-01-05T12:00:00Z",
            "2026-01-11T12:00:00Z",
        ]);
        // Weeks: {1,2} -> week 1, {3,4} -> week 2. Keep 1 week: id 4.
        assert_eq!(kept(&periods(Period::Weekly, 1), &c), vec![4]);
        assert_eq!(kept(&periods(Period::Weekly, 2), &c), vec![2, 4]);
    }

    #[test]
    fn keep_monthly_and_yearly() {
        let c = cands(&[
            "2024-12-31T12:00:00Z",
            "2025-06-01T12:00:00Z",
            "2025-06-30T12:00:00Z",
            "2025-07-01T12:00:00Z",
            "2026-01-01T12:00:00Z",
        ]);
        assert_eq!(kept(&periods(Period::Monthly, 3), &c), vec![3, 4, 5]);
        assert_eq!(kept(&periods(Period::Yearly, 2), &c), vec![4, 5]);
        // Three years asked, three exist: 2024's only backup is its newest.
        assert_eq!(kept(&periods(Period::Yearly, 3), &c), vec![1, 4, 5]);
    }

    #[test]
    fn a_rule_with_room_keeps_the_oldest() {
        // Two days of backups, keep 7 days: the two days' newest and the oldest.
        let c = twice_daily(2);
        assert_eq!(kept(&periods(Period::Daily, 7), &c), vec![1, 2, 4]);
    }

    #[test]
    fn keep_within_is_relative_to_the_newest_backup() {
        let c = cands(&[
            "2026-01-01T00:00:00Z",
            "2026-02-10T00:00:00Z",
            "2026-03-01T00:00:00Z",
            "2026-03-15T00:00:00Z",
        ]);
        let p = Policy {
            within: Some("1mo".parse().expect("span")),
            ..Policy::default()
        };
        // One month before 2026-03-15 is 2026-02-15.
        assert_eq!(kept(&p, &c), vec![3, 4]);
    }

    #[test]
    fn keep_tag_keeps_every_tagged_backup() {
        let mut c = twice_daily(2);
        c[0].tags = vec!["release".into()];
        c[2].tags = vec!["other".into(), "release".into()];
        let p = Policy {
            tags: vec!["release".into()],
            ..Policy::default()
        };
        // Tagged 1 and 3, and the newest (4) always.
        assert_eq!(kept(&p, &c), vec![1, 3, 4]);
    }

    #[test]
    fn groups_are_decided_separately() {
        // A frequent source and a rare one: keep-last 2 keeps both of each.
        let mut c = twice_daily(5);
        for x in c.iter_mut() {
            x.group = "busy".into();
        }
        c.push(Candidate {
            id: 100,
            time: at("2025-01-01T00:00:00Z"),
            group: "rare".into(),
            tags: Vec::new(),
        });
        let p = Policy {
            last: Some(Count::Limit(2)),
            ..Policy::default()
        };
        assert_eq!(kept(&p, &c), vec![9, 10, 100]);
    }

    #[test]
    fn counts_parse() {
        assert_eq!("3".parse::<Count>().expect("count"), Count::Limit(3));
        assert_eq!(
            "unlimited".parse::<Count>().expect("count"),
            Count::Unlimited
        );
        assert!("-1".parse::<Count>().is_err());
        assert!("lots".parse::<Count>().is_err());
    }

    fn policy_strategy() -> impl Strategy<Value = Policy> {
        (
            proptest::option::of(0usize..4),
            proptest::collection::btree_map(0usize..5, 0usize..4, 0..3),
            proptest::option::of(0i64..100),
            any::<bool>(),
        )
            .prop_map(|(last, per, within, tag)| Policy {
                last: last.map(Count::Limit),
                periods: per
                    .into_iter()
                    .map(|(p, n)| (Period::ALL[p], Count::Limit(n)))
                    .collect(),
                within: within.map(|h| Span::new().hours(h)),
                tags: if tag { vec!["t".into()] } else { Vec::new() },
            })
    }

    proptest! {
        /// The newest backup of every group is kept unless `--keep-last 0`;
        /// every kept backup is justified by a rule; the decision covers
        /// every backup once.
        #[test]
        fn newest_kept_and_every_keep_justified(
            policy in policy_strategy(),
            raw in proptest::collection::vec((0i64..2_000_000_000, 0u8..3, any::<bool>()), 1..40),
        ) {
            let candidates: Vec<Candidate> = raw.iter().enumerate().map(|(i, &(t, g, tagged))| Candidate {
                id: i as BackupId + 1,
                time: t,
                group: format!("g{g}"),
                tags: if tagged { vec!["t".into()] } else { Vec::new() },
            }).collect();
            let d = decide(&policy, &candidates, &TimeZone::UTC).expect("decide");
            prop_assert_eq!(d.len(), candidates.len());
            let mut seen: Vec<BackupId> = d.iter().map(|x| x.id).collect();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len(), candidates.len());
            for g in 0u8..3 {
                let group = format!("g{g}");
                let newest = candidates.iter().filter(|c| c.group == group).max_by_key(|c| (c.time, c.id));
                if let Some(n) = newest {
                    let dec = d.iter().find(|x| x.id == n.id).expect("decided");
                    if policy.last != Some(Count::Limit(0)) {
                        prop_assert!(dec.keep(), "newest of {} removed", group);
                    }
                }
            }
            for x in &d {
                let c = candidates.iter().find(|c| c.id == x.id).expect("candidate");
                for r in &x.reasons {
                    match r {
                        Reason::Tag { tag } => prop_assert!(c.tags.contains(tag)),
                        Reason::Last => prop_assert!(policy.last.is_some()),
                        Reason::Period { period } | Reason::Oldest { period } => prop_assert!(policy.periods.contains_key(period)),
                        Reason::Within => prop_assert!(policy.within.is_some()),
                        Reason::Newest => prop_assert!(policy.last != Some(Count::Limit(0))),
                    }
                }
            }
        }
    }
}
