from mpi4py import MPI


def work(x):
    return x * 2


comm = MPI.COMM_WORLD
if comm.Get_rank() == 0:  # the master hands out the numbers 0..19 and prints each answer
    todo, status = list(range(20)), MPI.Status()
    busy = comm.Get_size() - 1
    for rank in range(1, comm.Get_size()):
        comm.send(todo.pop(0), dest=rank)
    while busy:
        x, answer = comm.recv(source=MPI.ANY_SOURCE, status=status)
        print(x, answer)
        if todo:
            comm.send(todo.pop(0), dest=status.Get_source())
        else:  # nothing left: this worker may stop
            comm.send(None, dest=status.Get_source())
            busy -= 1
else:  # a worker answers until it is sent None
    while (x := comm.recv(source=0)) is not None:
        comm.send((x, work(x)), dest=0)
