//! The tensor collectives on CPU tensors, through the shm backend's host buffers: results
//! keep their shapes (all-gather and reduce-scatter along the leading dimension), in-place
//! all-reduce writes into its input, and bad shapes fail on every rank without a hang.

use candle_core::{DType as CandleDType, Device, Shape, Tensor};
use weft_collectives::{CommError, Communicator, ReduceOp, ShmCommunicator};
use weft_parallel::{ParallelError, TensorCollectives};

fn on_two_ranks(each: impl Fn(&ShmCommunicator) + Sync) {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    std::thread::scope(|scope| {
        let each = &each;
        for comm in &comms {
            scope.spawn(move || each(comm));
        }
    });
}

#[test]
fn tensor_collectives_keep_shapes_and_values() {
    on_two_ranks(|comm| {
        let rank = comm.rank() as f32;
        let tensor = (Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap()
            + rank as f64)
            .unwrap();
        let summed = comm
            .all_reduce_tensor(&tensor, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            summed.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 3.0, 5.0], vec![7.0, 9.0, 11.0]]
        );
        let gathered = comm.all_gather_tensor(&tensor).unwrap().wait().unwrap();
        assert_eq!(gathered.dims(), &[4, 3]);
        let scattered = comm
            .reduce_scatter_tensor(&tensor, ReduceOp::Max)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(scattered.dims(), &[1, 3]);
        let expected_row = if comm.rank() == 0 {
            [1.0, 2.0, 3.0]
        } else {
            [4.0, 5.0, 6.0]
        };
        assert_eq!(
            scattered.to_vec2::<f32>().unwrap(),
            vec![expected_row.to_vec()]
        );
        let from_one = comm.broadcast_tensor(&tensor, 1).unwrap().wait().unwrap();
        assert_eq!(from_one.to_vec2::<f32>().unwrap()[0], vec![1.0, 2.0, 3.0]);
        let shape = Shape::from((3, 2));
        if comm.rank() == 0 {
            let ints = Tensor::arange(0i64, 6, &Device::Cpu)
                .unwrap()
                .reshape((3, 2))
                .unwrap();
            comm.send_tensor(&ints, 1).unwrap().wait().unwrap();
        } else {
            let got = comm
                .recv_tensor(&shape, CandleDType::I64, &candle_core::Device::Cpu, 0)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(
                got.to_vec2::<i64>().unwrap(),
                vec![vec![0, 1], vec![2, 3], vec![4, 5]]
            );
        }
        let odd = Tensor::zeros((3, 2), CandleDType::F32, &Device::Cpu).unwrap();
        let err = comm
            .reduce_scatter_tensor(&odd, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(
            matches!(err, ParallelError::Comm(CommError::InvalidArgument { .. })),
            "{err}"
        );
    });
}

#[test]
fn in_place_all_reduce_writes_into_its_input() {
    on_two_ranks(|comm| {
        let r = comm.rank() as f32;
        let bucket = Tensor::new(&[r, 1.0, 2.0 * r], &Device::Cpu).unwrap();
        let returned = comm
            .all_reduce_tensor_in_place(&bucket, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(bucket.to_vec1::<f32>().unwrap(), vec![1.0, 2.0, 2.0]);
        assert_eq!(returned.to_vec1::<f32>().unwrap(), vec![1.0, 2.0, 2.0]);
        let strided = Tensor::zeros((2, 2), CandleDType::F32, &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        let refused = comm
            .all_reduce_tensor_in_place(&strided, ReduceOp::Sum)
            .unwrap_err();
        assert!(refused.to_string().contains("contiguous"), "{refused}");
        let root_sum = comm
            .reduce_tensor(&bucket, ReduceOp::Sum, 0)
            .unwrap()
            .wait()
            .unwrap();
        let expected = if comm.rank() == 0 {
            [2.0, 4.0, 4.0]
        } else {
            [1.0, 2.0, 2.0]
        };
        assert_eq!(root_sum.to_vec1::<f32>().unwrap(), expected);
    });
}
