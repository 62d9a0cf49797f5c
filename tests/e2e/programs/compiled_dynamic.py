"""torch.compile(dynamic=True): a small MLP trained on batches of three sizes, so that dynamo
traces with symbolic sizes (SymInts) once and the compiled code serves every size.

    python compiled_dynamic.py
"""
import torch


def main():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    compiled = torch.compile(net, dynamic=True)
    for batch in (8, 12, 16):
        x = torch.randn(batch, 16)
        opt.zero_grad()
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.9e}")


if __name__ == "__main__":
    main()
