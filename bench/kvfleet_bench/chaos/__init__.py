"""The chaos soak (bench/chaos.py): a seeded fault schedule, a fault-injecting proxy, steady
load, and the report of what each fault cost."""
