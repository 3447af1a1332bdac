"""Grading: state checks, trace checks, the judge and the score, on a trial's recorded observations."""
