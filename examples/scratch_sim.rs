#[path = "support/evidence_sim.rs"]
mod sim;
use std::time::Duration;
fn main() {
    let which: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let p = sim::family()[which];
    let mut rng = sim::Rng::new(7);
    let mut shown = 0;
    for _ in 0..3000 {
        let instant = rng.uniform(40.0, 70.0);
        let proxy = rng.log_uniform(0.2, 40.0);
        let mut trace = p.arrivals(&mut rng, (instant - 60.0f64).max(0.0), 110.0, instant);
        let trigger = instant;
        trace.retain(|&t| t < trigger + proxy);
        let arrivals: Vec<Duration> = trace.iter().map(|&t| Duration::from_secs_f64(t)).collect();
        let out = lameduck::__evidence_sim::drain(
            &arrivals,
            Duration::from_secs_f64(trigger),
            &lameduck::Propagation::default(),
            Duration::from_secs(30),
        )
        .unwrap();
        let c = trigger + out.commit.as_secs_f64();
        let lost: Vec<f64> = trace
            .iter()
            .filter(|&&t| t > c)
            .map(|t| t - trigger)
            .collect();
        if !lost.is_empty() && out.evidence.kind != lameduck::EvidenceKind::Max && shown < 5 {
            shown += 1;
            // gaps before trigger
            let w: Vec<f64> = trace
                .iter()
                .filter(|&&t| t > trigger - 30.0)
                .map(|t| t - trigger)
                .collect();
            let mut gaps: Vec<f64> = w
                .windows(2)
                .map(|x| x[1] - x[0])
                .filter(|&g| g > 0.5)
                .collect();
            gaps.iter_mut()
                .for_each(|g| *g = (*g * 10.0).round() / 10.0);
            println!(
                "proxy {proxy:.1} commit {:.2} first lost {:.2} n_lost {} gaps>0.5 {:?}\n  {}",
                out.commit.as_secs_f64(),
                lost[0],
                lost.len(),
                gaps,
                serde_json::to_string(&out.evidence).unwrap()
            );
        }
    }
}
