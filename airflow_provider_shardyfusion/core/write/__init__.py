"""The writer's logic, run by the Spark job and the write operator."""
