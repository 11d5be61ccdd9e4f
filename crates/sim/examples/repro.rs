//! Runs the reproduction experiments without the full `kaiso` binary:
//! `cargo run --release -p kaiso-sim --example repro -- 002|ch3|t4|t7|t8 [--quick] [--seed N]`
//! (`kaiso sim repro` runs the same code).

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
        other => {
            eprintln!("unknown experiment {other:?}: 002, t4, t7, t8 or ch3");
            std::process::exit(2);
        }
    }
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}
