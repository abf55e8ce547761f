"""The fields a task of this dataset may carry in its task_data.json: the runner checks
each task's against this model in the sandbox (where pydantic is installed) and hands
verify() the typed values."""

from pydantic import BaseModel


class TaskData(BaseModel):
    #: The number a task's answer file must hold (shared-grader).
    expected: int | None = None
    #: That file, relative to the working directory.
    file: str = "answer.txt"
    #: What a greeting script must print (async-checks).
    greeting: str | None = None
