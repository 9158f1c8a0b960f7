# The two commands of the README.
run:
	./scripts/run.sh
test:
	./scripts/test.sh
.PHONY: run test
