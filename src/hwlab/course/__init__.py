"""The course floor: grading a learner against the kit's own walk.

Checkpoints in the notebooks (``checkpoint``), exercise checkers and the cases they grade
(``exercise``; ``exercise_checks`` indexes ``ex01_checks`` ... ``ex04_checks``, ``own_kernel_check``
and ``toolchain_check``), the reading exercise's checks and the facts they are graded
against (``reading_checks``, ``reading_facts``), diagnosis drills (``drills``) and the instructor's
class record (``classroom``). It sits above the diagnosis floor, whose walks it grades, beside
``examine``; only the CLI and the notebooks import it.
"""
