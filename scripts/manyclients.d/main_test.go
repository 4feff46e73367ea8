package main

import "testing"

func sweep(rounds ...[]float64) []Summary {
	sum := make([]Summary, len(rounds))
	for i, g := range rounds {
		sum[i].N = 1 << i
		sum[i].Goodputs = g
		sum[i].GoodputMBps = median(append([]float64(nil), g...))
	}
	return sum
}

func TestRatioIntervalSteady(t *testing.T) {
	// Rounds that agree leave nothing to resample: the interval is the ratio.
	sum := sweep([]float64{100, 100, 100}, []float64{200, 200, 200}, []float64{190, 190, 190})
	lo, hi, ok := ratioInterval(sum, 0.9)
	if !ok || lo != 0.95 || hi != 0.95 {
		t.Fatalf("steady rounds: interval %v..%v (ok %v), want 0.95..0.95", lo, hi, ok)
	}
}

func TestRatioIntervalNoisy(t *testing.T) {
	sum := sweep(
		[]float64{275, 260, 290, 281, 270},
		[]float64{385, 330, 420, 371, 402},
		[]float64{362, 340, 351, 398, 330},
	)
	ratio := sum[2].GoodputMBps / sum[1].GoodputMBps
	lo, hi, ok := ratioInterval(sum, 0.9)
	if !ok || !(lo < ratio && ratio < hi) || hi > 1.2 || lo < 0.7 {
		t.Fatalf("interval %v..%v (ok %v) for a ratio of %v", lo, hi, ok, ratio)
	}
	if lo2, hi2, _ := ratioInterval(sum, 0.9); lo2 != lo || hi2 != hi {
		t.Fatalf("same rounds, another interval: %v..%v then %v..%v", lo, hi, lo2, hi2)
	}
	if lo50, hi50, _ := ratioInterval(sum, 0.5); lo50 < lo || hi50 > hi {
		t.Fatalf("50 %% interval %v..%v outside the 90 %% one %v..%v", lo50, hi50, lo, hi)
	}
}

func TestRatioIntervalFewRounds(t *testing.T) {
	if _, _, ok := ratioInterval(sweep([]float64{1, 2, 3}, []float64{1, 2}), 0.9); ok {
		t.Fatal("an interval from two rounds")
	}
}
