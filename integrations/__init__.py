"""Plugs for the two engines people scale out with: TRL (trl_grpo.py) and verl (verl_plugin.py).

Neither is a dependency of the project: each module imports its engine at the top, so
import it only in an environment that has the engine (requirements/trl.txt,
requirements/verl.txt).
"""
