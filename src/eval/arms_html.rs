//! The arm table as HTML: one `<table>` per run with the line that says
//! which differences are significant. The statistics are `arms.rs`'s; this
//! file only draws them.

use std::fmt::Write;

use super::arms::{ArmsReport, Interval, RunArms};
use super::markup::escape;

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |r| format!("{:.1}%", r * 100.0))
}

fn usd(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |r| format!("{r:.4}"))
}

/// `0.226 (0.180 – 0.275)`; `–` when undefined.
fn mean_with(mean: Option<f64>, interval: Option<Interval>, digits: usize) -> String {
    match (mean, interval) {
        (None, _) => "–".to_string(),
        (Some(m), None) => format!("{m:.digits$}"),
        (Some(m), Some(i)) => format!("{m:.digits$} ({:.digits$} – {:.digits$})", i.low, i.high),
    }
}

/// The arm table of one run as an HTML `<table id="arms">` (the first run)
/// or `arms-<i>`, with a line saying which differences are significant.
pub fn run_table_html(run: &RunArms, index: usize, page: &mut String) {
    let id = if index == 0 {
        "arms".to_string()
    } else {
        format!("arms-{index}")
    };
    let _ = writeln!(
        page,
        "<h3>Run {}</h3>\n<table id=\"{id}\"><tr><th>arm</th><th>pulls</th><th>outcomes</th><th>rescues</th><th>rescue rate</th><th>95% interval (Wilson)</th><th>transfer (95%)</th><th>reliance, nats/token (95%)</th><th>posterior mean</th><th>spend (USD)</th><th>cost per rescue (USD)</th></tr>",
        escape(&run.run_id)
    );
    for a in &run.arms {
        let name = if a.control {
            format!("{} (control)", escape(&a.arm))
        } else {
            escape(&a.arm)
        };
        let interval = a.interval.map_or_else(
            || "–".to_string(),
            |i| format!("{:.1}% – {:.1}%", i.low * 100.0, i.high * 100.0),
        );
        let transfer = mean_with(a.transfer, a.transfer_interval, 3);
        let reliance = mean_with(a.reliance, a.reliance_interval, 2);
        let _ = writeln!(
            page,
            "<tr><td>{name}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{interval}</td><td class=\"num\">{transfer}</td><td class=\"num\">{reliance}</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.4}</td><td class=\"num\">{}</td></tr>",
            a.pulls,
            a.trials,
            a.rescues,
            percent(a.rescue_rate),
            a.posterior_mean,
            a.spend_usd,
            usd(a.cost_per_rescue_usd),
        );
    }
    page.push_str("</table>\n");
    let verdict = match &run.leader {
        None => "No outcomes yet: no rescue rate to compare.".to_string(),
        Some(leader) if run.not_separated.is_empty() => format!(
            "{} leads, and its interval overlaps no other arm's: the difference is significant (95%).",
            escape(leader)
        ),
        Some(leader) => format!(
            "{} leads, but its interval overlaps {}: not significant yet; more pulls narrow the intervals.",
            escape(leader),
            run.not_separated
                .iter()
                .map(|a| escape(a))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let _ = writeln!(
        page,
        "<p class=\"meta\">{verdict} Refined hints rescue {}, fresh ones {}; cost per rescue {} USD.</p>",
        percent(run.refined_rescue_rate),
        percent(run.fresh_rescue_rate),
        usd(run.cost_per_rescue_usd)
    );
}

/// The arms section of a page: one table per run.
pub fn section_html(report: &ArmsReport, page: &mut String) {
    let _ = writeln!(
        page,
        "<h2>Arms</h2>\n<p class=\"meta\">{} hints from {}, {} outcomes from {}; arms from the {}.</p>",
        report.hints_read,
        escape(&report.hints_file),
        report.outcomes_read,
        escape(report.outcomes_file.as_deref().unwrap_or("(none)")),
        report.arms_from
    );
    for (i, run) in report.runs.iter().enumerate() {
        run_table_html(run, i, page);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::arms::ArmRow;

    fn row(arm: &str, control: bool, trials: i64, rescues: i64) -> ArmRow {
        ArmRow {
            arm: arm.into(),
            control,
            pulls: trials,
            trials,
            rescues,
            rescue_rate: (trials > 0).then(|| rescues as f64 / trials as f64),
            interval: None,
            transfer_outcomes: 0,
            transfer: None,
            transfer_interval: None,
            reliance: None,
            reliance_interval: None,
            posterior_mean: 0.5,
            spend_usd: 0.1,
            cost_per_rescue_usd: None,
        }
    }

    #[test]
    fn the_first_run_is_the_arms_table_and_says_what_is_not_significant() {
        let run = RunArms {
            run_id: "r<1>".into(),
            arms: vec![row("strong", false, 10, 7), row("control", true, 2, 1)],
            leader: Some("strong".into()),
            not_separated: vec!["control".into()],
            refined_rescue_rate: None,
            fresh_rescue_rate: Some(0.5),
            cost_per_rescue_usd: None,
        };
        let mut page = String::new();
        run_table_html(&run, 0, &mut page);
        assert!(page.contains("<table id=\"arms\">") && page.contains("control (control)"));
        assert!(page.contains("not significant yet"), "{page}");
        assert!(page.contains("Run r&lt;1&gt;"), "run ids are escaped: {page}");
        let mut second = String::new();
        run_table_html(&run, 1, &mut second);
        assert!(second.contains("<table id=\"arms-1\">"), "{second}");
    }
}
