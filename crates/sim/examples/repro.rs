//! Runs the reproduction experiments and the policy suite without the full `kaiso` binary:
//! `cargo run --release -p kaiso-sim --example repro -- 002|ch3|t4|t7|t8 [--quick] [--seed N]`
//! `cargo run --release -p kaiso-sim --example repro -- suite [--quick|--tiny]
//!  [--workloads a,b] [--policies a,b] [--kaiso key=value,...]`
//! (`kaiso sim repro` and `kaiso sim suite` run the same code).

use kaiso_sim::experiments::{Scale, ch3, table4, table7, table8};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scale = if args.iter().any(|a| a == "--quick") {
        Scale::QUICK
    } else {
        Scale::FULL
    };
    let seed = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let which = args.first().map(String::as_str).unwrap_or("002");
    let mut progress = |m: &str| eprintln!("… {m}");
    let started = std::time::Instant::now();
    let print = |t: kaiso_sim::experiments::Table| println!("{}", t.markdown());
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match which {
        "002" => {
            print(table4(scale, seed, &mut progress));
            print(table7(scale, seed, &mut progress));
            print(table8(scale, seed, &mut progress));
        }
        "t4" => print(table4(scale, seed, &mut progress)),
        "t7" => print(table7(scale, seed, &mut progress)),
        "t8" => print(table8(scale, seed, &mut progress)),
        "ch3" => ch3(scale, seed, &mut progress).into_iter().for_each(print),
        "suite" => {
            use kaiso_sim::suite::{SuiteScale, SuiteSpec, markdown, run_suite};
            let scale = if args.iter().any(|a| a == "--quick") {
                SuiteScale::QUICK
            } else if args.iter().any(|a| a == "--tiny") {
                SuiteScale::TINY
            } else {
                SuiteScale::FULL
            };
            let mut spec = SuiteSpec::new(scale, seed);
            let list = |s: String| s.split(',').map(str::to_string).collect::<Vec<_>>();
            if let Some(w) = arg("--workloads") {
                spec.workloads = list(w);
            }
            if let Some(p) = arg("--policies") {
                spec.policies = list(p);
            }
            if let Some(r) = arg("--volume-region").and_then(|r| r.parse::<u64>().ok()) {
                spec.volume_region = r << 20;
            }
            if let Some(k) = arg("--kaiso") {
                let mut v = serde_json::Map::new();
                for kv in k.split(',') {
                    let Some((key, val)) = kv.split_once('=') else {
                        eprintln!("--kaiso: expected key=value, got {kv:?}");
                        std::process::exit(2);
                    };
                    let val = match val {
                        "true" => serde_json::Value::Bool(true),
                        "false" => serde_json::Value::Bool(false),
                        n => match (n.parse::<u64>(), n.parse::<f64>()) {
                            (Ok(i), _) => i.into(),
                            (_, Ok(f)) => f.into(),
                            _ => {
                                eprintln!("--kaiso {key}: {n:?} is not a number");
                                std::process::exit(2);
                            }
                        },
                    };
                    v.insert(key.to_string(), val);
                }
                match serde_json::from_value(serde_json::Value::Object(v)) {
                    Ok(c) => spec.kaiso = c,
                    Err(e) => {
                        eprintln!("--kaiso: {e}");
                        std::process::exit(2);
                    }
                }
            }
            match run_suite(&spec, &mut |d, t, m| eprintln!("… [{d}/{t}] {m}")) {
                Ok(r) => println!("{}", markdown(&r)),
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(2);
                }
            }
        }
        other => {
            eprintln!("unknown experiment {other:?}: 002, t4, t7, t8, ch3 or suite");
            std::process::exit(2);
        }
    }
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}
