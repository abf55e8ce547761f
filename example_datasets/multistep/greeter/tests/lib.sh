# Shared by every step's test.sh (the task's tests/ lie under each step's).
score() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
greeting() { (cd /work && ./greet.sh 2>/dev/null); }
