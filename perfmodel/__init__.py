"""Where the time of a run goes, predicted: costs read off a run's trace (costs.py), a
discrete-event simulation of the controller driven by them (simulator.py), the CPU sharing
model both use (cpu.py), first-principles costs for GPU clusters (cluster.py), and the
search over placements and settings (tune.py). Pure computation: no processes, no torch."""
