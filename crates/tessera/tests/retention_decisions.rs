//! Snapshot tests of `forget`'s decisions on fixed calendars: a change to
//! which backup a rule keeps, or why, shows as a reviewed diff of
//! `tests/snapshots/` (`cargo insta review`, or `INSTA_UPDATE=always`).

use jiff::tz::{Offset, TimeZone};
use jiff::{Span, Timestamp};
use std::collections::BTreeMap;
use std::fmt::Write;
use tessera::commands::retention::{decide, Candidate, Count, Period, Policy};

/// 2025-12-20T00:00:00Z: a calendar crossing a year, months of 28 to 31
/// days and ISO weeks that start in one year and end in the next.
const START: i64 = 1_766_188_800;

/// Backups every `step_hours` for `days` days from [`START`], in two
/// groups (every fifth backup is the second group's, tagged `release`).
fn calendar(step_hours: i64, days: i64) -> Vec<Candidate> {
    let n = days * 24 / step_hours;
    (0..n)
        .map(|i| Candidate {
            id: i as u64 + 1,
            time: START + i * step_hours * 3600,
            group: if i % 5 == 4 {
                "host-b /srv"
            } else {
                "host-a /home"
            }
            .into(),
            tags: if i % 5 == 4 {
                vec!["release".into()]
            } else {
                vec![]
            },
        })
        .collect()
}

fn policy(last: Option<usize>, periods: &[(Period, usize)]) -> Policy {
    Policy {
        last: last.map(Count::Limit),
        periods: periods
            .iter()
            .map(|&(p, n)| (p, Count::Limit(n)))
            .collect::<BTreeMap<_, _>>(),
        within: None,
        tags: Vec::new(),
    }
}

/// The kept backups, one line each (`group id time reasons`), then how
/// many each group removes.
fn render(policy: &Policy, candidates: &[Candidate], tz: &TimeZone) -> String {
    let decisions = decide(policy, candidates, tz).expect("retention decides");
    let mut out = String::new();
    let mut removed: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &decisions {
        if d.keep() {
            let t = Timestamp::from_second(d.time)
                .unwrap()
                .to_zoned_datetime(tz.clone());
            let reasons: Vec<String> = d.reasons.iter().map(|r| r.to_string()).collect();
            writeln!(
                out,
                "{} #{} {} {}",
                d.group,
                d.id,
                t.strftime("%Y-%m-%d %H:%M %:z"),
                reasons.join(", ")
            )
            .unwrap();
        } else {
            *removed.entry(&d.group).or_default() += 1;
        }
    }
    for (group, n) in removed {
        writeln!(out, "{group}: {n} removed").unwrap();
    }
    out
}

#[test]
fn keep_last() {
    let c = calendar(6, 10);
    insta::assert_snapshot!(render(&policy(Some(3), &[]), &c, &TimeZone::UTC));
}

#[test]
fn daily_weekly_monthly_yearly() {
    let c = calendar(6, 400);
    let p = policy(
        None,
        &[
            (Period::Daily, 7),
            (Period::Weekly, 4),
            (Period::Monthly, 6),
            (Period::Yearly, 2),
        ],
    );
    insta::assert_snapshot!(render(&p, &c, &TimeZone::UTC));
}

#[test]
fn hourly_in_a_time_zone_east_of_utc() {
    let c = calendar(1, 2);
    let tz = TimeZone::fixed(Offset::constant(9));
    insta::assert_snapshot!(render(
        &policy(None, &[(Period::Hourly, 12), (Period::Daily, 2)]),
        &c,
        &tz
    ));
}

#[test]
fn within_and_tags() {
    let c = calendar(12, 30);
    let mut p = policy(Some(1), &[]);
    p.within = Some(Span::new().days(3));
    p.tags = vec!["release".into()];
    insta::assert_snapshot!(render(&p, &c, &TimeZone::UTC));
}

#[test]
fn rules_with_more_room_than_backups_keep_the_oldest() {
    let c = calendar(24, 20);
    let p = policy(None, &[(Period::Weekly, 10), (Period::Monthly, 12)]);
    insta::assert_snapshot!(render(&p, &c, &TimeZone::UTC));
}
